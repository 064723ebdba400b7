//! Metadata values: the thirteen GGUF value types, as Rust values.
//!
//! Arrays keep their elements in a typed vector (`Vec<u8>`, `Vec<String>`,
//! …) rather than as a vector of [`Value`]s: a 150 000-token vocabulary's
//! `i32` token types then take 600 KB, not 150 000 enum values, and a
//! crafted array costs at most a few times the bytes it occupies in the
//! file. Arrays may nest (the `gguf` Python package writes them), each
//! inner array with its own element type.

use std::fmt;

/// The type tag of a metadata value, as stored in the file.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ValueType {
    /// `UINT8` (0).
    U8,
    /// `INT8` (1).
    I8,
    /// `UINT16` (2).
    U16,
    /// `INT16` (3).
    I16,
    /// `UINT32` (4).
    U32,
    /// `INT32` (5).
    I32,
    /// `FLOAT32` (6).
    F32,
    /// `BOOL` (7), one byte.
    Bool,
    /// `STRING` (8): `u64` length and UTF-8 bytes.
    String,
    /// `ARRAY` (9): `u32` element type, `u64` count, the elements.
    Array,
    /// `UINT64` (10).
    U64,
    /// `INT64` (11).
    I64,
    /// `FLOAT64` (12).
    F64,
}

const VALUE_TYPES: [(ValueType, &str); 13] = [
    (ValueType::U8, "u8"),
    (ValueType::I8, "i8"),
    (ValueType::U16, "u16"),
    (ValueType::I16, "i16"),
    (ValueType::U32, "u32"),
    (ValueType::I32, "i32"),
    (ValueType::F32, "f32"),
    (ValueType::Bool, "bool"),
    (ValueType::String, "string"),
    (ValueType::Array, "array"),
    (ValueType::U64, "u64"),
    (ValueType::I64, "i64"),
    (ValueType::F64, "f64"),
];

impl ValueType {
    /// The type with this tag, `None` for a tag GGUF does not define.
    pub fn from_id(id: u32) -> Option<ValueType> {
        let i = usize::try_from(id).ok()?;
        VALUE_TYPES.get(i).map(|e| e.0)
    }

    /// The tag stored in the file.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// A short name for messages (`u32`, `string`, `array`).
    pub fn name(self) -> &'static str {
        VALUE_TYPES
            .get(self as usize)
            .map(|e| e.1)
            .unwrap_or("unknown")
    }

    /// The fewest bytes one value of this type takes in the file: the fixed
    /// size of a number, the length prefix of a string, the element type
    /// and count of an array. Used to check counts before reserving memory.
    pub fn min_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 4 + 8,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, PartialEq, Debug)]
pub enum Value {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING`.
    String(String),
    /// `ARRAY`.
    Array(Array),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

/// An array value: a typed vector of elements.
#[derive(Clone, PartialEq, Debug)]
pub enum Array {
    /// Elements of type `UINT8`.
    U8(Vec<u8>),
    /// Elements of type `INT8`.
    I8(Vec<i8>),
    /// Elements of type `UINT16`.
    U16(Vec<u16>),
    /// Elements of type `INT16`.
    I16(Vec<i16>),
    /// Elements of type `UINT32`.
    U32(Vec<u32>),
    /// Elements of type `INT32`.
    I32(Vec<i32>),
    /// Elements of type `FLOAT32`.
    F32(Vec<f32>),
    /// Elements of type `BOOL`.
    Bool(Vec<bool>),
    /// Elements of type `STRING`.
    String(Vec<String>),
    /// Elements that are arrays themselves, each with its own element type.
    Array(Vec<Array>),
    /// Elements of type `UINT64`.
    U64(Vec<u64>),
    /// Elements of type `INT64`.
    I64(Vec<i64>),
    /// Elements of type `FLOAT64`.
    F64(Vec<f64>),
}

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A description of the type for messages: `u32`, `string`, or
    /// `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.element_type()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer, whatever its width; `None` when it is not
    /// an integer type.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an `f64` when it is `FLOAT32` or `FLOAT64`.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, when the value is a `STRING`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, when the value is a `BOOL`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, when the value is an `ARRAY`.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    /// The type of the elements.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as integers, whatever their width; `None` when the
    /// elements are not integers. Allocates one `i128` per element.
    pub fn to_integers(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => widen(v),
            Array::I8(v) => widen(v),
            Array::U16(v) => widen(v),
            Array::I16(v) => widen(v),
            Array::U32(v) => widen(v),
            Array::I32(v) => widen(v),
            Array::U64(v) => widen(v),
            Array::I64(v) => widen(v),
            _ => return None,
        })
    }
}

/// How many elements of an array `Display` shows before it summarises.
const SHOWN_ELEMENTS: usize = 8;

fn fmt_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    mut one: impl FnMut(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.iter().take(SHOWN_ELEMENTS).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        one(f, item)?;
    }
    if items.len() > SHOWN_ELEMENTS {
        write!(f, ", … ({} in all)", items.len())?;
    }
    f.write_str("]")
}

/// A short, one-line rendering for logs: numbers as Rust prints them,
/// strings quoted (escaped), arrays with their first elements and their
/// length. A long tokenizer vocabulary stays one short line.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// Like [`Value`]'s `Display`: the first elements and the length.
impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Array::U8(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::I8(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::U16(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::I16(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::U32(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::I32(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::F32(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::Bool(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::String(v) => fmt_list(f, v, |f, x| write!(f, "{x:?}")),
            Array::Array(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::U64(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::I64(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
            Array::F64(v) => fmt_list(f, v, |f, x| write!(f, "{x}")),
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value {
                Value::$v(x)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value {
                Value::Array(Array::$v(x))
            }
        }
        impl From<&[$t]> for Value {
            fn from(x: &[$t]) -> Value {
                Value::Array(Array::$v(x.to_vec()))
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Array {
                Array::$v(x)
            }
        }
    )*};
}

from_scalar!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    f32 => F32, bool => Bool, u64 => U64, i64 => I64, f64 => F64,
);

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Value {
        Value::Array(Array::String(v))
    }
}

impl From<&[&str]> for Value {
    fn from(v: &[&str]) -> Value {
        Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::from(v.as_slice())
    }
}

impl From<Vec<String>> for Array {
    fn from(v: Vec<String>) -> Array {
        Array::String(v)
    }
}

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Array {
        Array::Array(v)
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13 {
            let t = ValueType::from_id(id).unwrap();
            assert_eq!(t.id(), id);
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::from_id(u32::MAX), None);
    }

    #[test]
    fn display_is_short() {
        let v = Value::from((0..1000).collect::<Vec<i32>>());
        assert_eq!(v.to_string(), "[0, 1, 2, 3, 4, 5, 6, 7, … (1000 in all)]");
        assert_eq!(Value::from("a\"b").to_string(), "\"a\\\"b\"");
        assert_eq!(v.type_description(), "array of i32");
    }
}
