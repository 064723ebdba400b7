//! [`Metadata`]: a GGUF file's key/value pairs, in file order, with typed
//! getters whose errors name the file and the key.
//!
//! Writers are not consistent about integer widths: llama.cpp's converter
//! writes most counts as `UINT32`, other tools use `INT32` or `UINT64` for
//! the same field, and `split.tensors.count` is `INT32`. The integer
//! getters therefore take any integer type whose value fits the type asked
//! for, and say so when it does not fit (`value -1 does not fit in u32`).
//! Floats likewise come as `FLOAT32` or `FLOAT64`. Strings, booleans and
//! arrays of strings must be exactly that.

use crate::value::{Array, Value};
use crate::{GgufError, Result, KEY_ARCHITECTURE};
use std::borrow::Cow;
use std::collections::HashMap;

/// The metadata of a GGUF file (of the first part, for a split set).
#[derive(Clone)]
pub struct Metadata {
    file: String,
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

/// Each key with its value's short `Display` form (long arrays
/// summarised), so that a debug print of a model stays readable.
impl std::fmt::Debug for Metadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        struct Short<'a>(&'a Value);
        impl std::fmt::Debug for Short<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
        f.debug_map()
            .entries(self.entries.iter().map(|(k, v)| (k, Short(v))))
            .finish()
    }
}

impl Metadata {
    /// `index` maps each key of `entries` to its position.
    pub(crate) fn new(
        file: String,
        entries: Vec<(String, Value)>,
        index: HashMap<String, usize>,
    ) -> Metadata {
        Metadata {
            file,
            entries,
            index,
        }
    }

    /// The file these came from, as errors name it.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let &i = self.index.get(key)?;
        self.entries.get(i).map(|(_, v)| v)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Every key and value, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Every key, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// The value of `key`, or an error naming it when absent.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            file: self.file.clone(),
            key: key.to_string(),
        })
    }

    /// `Ok(None)` when `key` is absent, else what `getter` makes of it: an
    /// optional key that, when present, must still be valid. For example
    /// `md.opt("llama.rope.freq_base", Metadata::f32)`.
    pub fn opt<'a, T>(
        &'a self,
        key: &str,
        getter: impl FnOnce(&'a Metadata, &str) -> Result<T>,
    ) -> Result<Option<T>> {
        if self.contains(key) {
            getter(self, key).map(Some)
        } else {
            Ok(None)
        }
    }

    fn bad(&self, key: &str, problem: String) -> GgufError {
        GgufError::BadValue {
            file: self.file.clone(),
            key: key.to_string(),
            problem,
        }
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, type_name: &str) -> Result<T> {
        let v = self.require(key)?;
        let Some(i) = v.as_integer() else {
            return Err(self.bad(
                key,
                format!(
                    "expected an integer ({type_name}), found {}",
                    v.type_description()
                ),
            ));
        };
        T::try_from(i).map_err(|_| self.bad(key, format!("value {i} does not fit in {type_name}")))
    }

    /// An integer that fits in a `u32`, stored as any integer type.
    pub fn u32(&self, key: &str) -> Result<u32> {
        self.integer(key, "u32")
    }

    /// A non-negative integer, stored as any integer type.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.integer(key, "u64")
    }

    /// An integer that fits in an `i32`, stored as any integer type.
    pub fn i32(&self, key: &str) -> Result<i32> {
        self.integer(key, "i32")
    }

    /// An integer that fits in an `i64`, stored as any integer type.
    pub fn i64(&self, key: &str) -> Result<i64> {
        self.integer(key, "i64")
    }

    /// A `FLOAT64` or `FLOAT32`.
    pub fn f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_float().ok_or_else(|| {
            self.bad(
                key,
                format!("expected a float, found {}", v.type_description()),
            )
        })
    }

    /// A `FLOAT32`, or a `FLOAT64` within `f32`'s range (rounded).
    pub fn f32(&self, key: &str) -> Result<f32> {
        let x = self.f64(key)?;
        let y = x as f32;
        if x.is_finite() && !y.is_finite() {
            return Err(self.bad(key, format!("value {x} does not fit in f32")));
        }
        Ok(y)
    }

    /// A `BOOL`.
    pub fn bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| {
            self.bad(
                key,
                format!("expected a bool, found {}", v.type_description()),
            )
        })
    }

    /// A `STRING`.
    pub fn str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| {
            self.bad(
                key,
                format!("expected a string, found {}", v.type_description()),
            )
        })
    }

    /// `general.architecture` (`llama`, `qwen2`, …).
    pub fn architecture(&self) -> Result<&str> {
        self.str(KEY_ARCHITECTURE)
    }

    /// An `ARRAY` of any element type.
    pub fn array(&self, key: &str) -> Result<&Array> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| {
            self.bad(
                key,
                format!("expected an array, found {}", v.type_description()),
            )
        })
    }

    /// An array of `STRING`s.
    pub fn str_array(&self, key: &str) -> Result<&[String]> {
        match self.array(key)? {
            Array::String(v) => Ok(v),
            a => Err(self.bad(
                key,
                format!(
                    "expected an array of string, found array of {}",
                    a.element_type()
                ),
            )),
        }
    }

    fn int_array<'a, T: TryFrom<i128> + Clone>(
        &'a self,
        key: &str,
        type_name: &str,
        exact: fn(&'a Array) -> Option<&'a [T]>,
    ) -> Result<Cow<'a, [T]>> {
        let a = self.array(key)?;
        if let Some(v) = exact(a) {
            return Ok(Cow::Borrowed(v));
        }
        let Some(ints) = a.to_integers() else {
            return Err(self.bad(
                key,
                format!(
                    "expected an array of integers ({type_name}), found array of {}",
                    a.element_type()
                ),
            ));
        };
        ints.into_iter()
            .enumerate()
            .map(|(j, i)| {
                T::try_from(i).map_err(|_| {
                    self.bad(
                        key,
                        format!("element {j} ({i}) does not fit in {type_name}"),
                    )
                })
            })
            .collect::<Result<Vec<T>>>()
            .map(Cow::Owned)
    }

    /// An array of integers that each fit in an `i32`, stored with any
    /// integer element type (borrowed when stored as `INT32`).
    pub fn i32_array(&self, key: &str) -> Result<Cow<'_, [i32]>> {
        self.int_array(key, "i32", |a| match a {
            Array::I32(v) => Some(v),
            _ => None,
        })
    }

    /// An array of integers that each fit in a `u32`, stored with any
    /// integer element type (borrowed when stored as `UINT32`).
    pub fn u32_array(&self, key: &str) -> Result<Cow<'_, [u32]>> {
        self.int_array(key, "u32", |a| match a {
            Array::U32(v) => Some(v),
            _ => None,
        })
    }

    /// An array of `FLOAT32` (borrowed) or `FLOAT64` (converted).
    pub fn f32_array(&self, key: &str) -> Result<Cow<'_, [f32]>> {
        match self.array(key)? {
            Array::F32(v) => Ok(Cow::Borrowed(v)),
            Array::F64(v) => Ok(Cow::Owned(v.iter().map(|&x| x as f32).collect())),
            a => Err(self.bad(
                key,
                format!(
                    "expected an array of floats, found array of {}",
                    a.element_type()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: Vec<(&str, Value)>) -> Metadata {
        let entries: Vec<(String, Value)> =
            pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Metadata::new("m.gguf".into(), entries, index)
    }

    #[test]
    fn integer_widths_are_accepted_when_they_fit() {
        let m = md(vec![
            ("a", Value::I32(7)),
            ("b", Value::U64(7)),
            ("c", Value::I32(-1)),
            ("d", Value::U64(u64::MAX)),
            ("e", Value::U8(3)),
            ("s", Value::from("x")),
        ]);
        assert_eq!(m.u32("a").unwrap(), 7);
        assert_eq!(m.u32("b").unwrap(), 7);
        assert_eq!(m.u32("e").unwrap(), 3);
        assert_eq!(m.i64("c").unwrap(), -1);
        assert_eq!(m.u64("d").unwrap(), u64::MAX);
        assert_eq!(
            m.u32("c").unwrap_err().to_string(),
            "m.gguf: metadata key \"c\": value -1 does not fit in u32"
        );
        assert_eq!(
            m.u32("d").unwrap_err().to_string(),
            "m.gguf: metadata key \"d\": value 18446744073709551615 does not fit in u32"
        );
        assert_eq!(
            m.u32("s").unwrap_err().to_string(),
            "m.gguf: metadata key \"s\": expected an integer (u32), found string"
        );
        assert_eq!(
            m.u32("zz").unwrap_err().to_string(),
            "m.gguf: metadata key \"zz\" is missing"
        );
        assert_eq!(m.opt("zz", Metadata::u32).unwrap(), None);
        assert_eq!(m.opt("a", Metadata::u32).unwrap(), Some(7));
        assert!(m.opt("s", Metadata::u32).is_err());
    }

    #[test]
    fn arrays_convert_or_borrow() {
        let m = md(vec![
            ("i", Value::from(vec![1i32, 2, 3])),
            ("u", Value::from(vec![1u64, 2, 3])),
            ("n", Value::from(vec![1i64, -2])),
            ("f", Value::from(vec![0.5f64])),
            ("s", Value::from(vec!["a", "b"])),
        ]);
        assert!(matches!(m.i32_array("i").unwrap(), Cow::Borrowed(_)));
        assert_eq!(&*m.i32_array("u").unwrap(), &[1, 2, 3]);
        assert_eq!(&*m.u32_array("u").unwrap(), &[1, 2, 3]);
        assert_eq!(
            m.u32_array("n").unwrap_err().to_string(),
            "m.gguf: metadata key \"n\": element 1 (-2) does not fit in u32"
        );
        assert_eq!(&*m.f32_array("f").unwrap(), &[0.5]);
        assert_eq!(m.str_array("s").unwrap(), &["a", "b"]);
        assert!(m.str_array("i").is_err());
        assert!(m.f32_array("s").is_err());
        assert!(m.i32_array("s").is_err());
    }
}
