//! The one error type of the crate.
//!
//! Every message starts with the file it is about (the path as the caller
//! gave it, or the name given to [`crate::GgufFile::from_bytes`]) and then
//! names what is at fault inside it: a metadata key (`metadata key
//! "general.name"`, or `metadata key 12 (after "general.name")` when the
//! key itself could not be read), a tensor (`blk.3.attn_k.weight`), or a
//! part of a split set. A user who sees only the message knows where to
//! look.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, read, mapped or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file (or directory) concerned.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },

    /// The file is not GGUF at all (wrong magic, too short), or is a GGUF
    /// this reader does not take: version 1, a version newer than 3, or
    /// big-endian.
    #[error("{file}: {problem}")]
    Unsupported {
        /// The file concerned.
        file: String,
        /// What is wrong with it.
        problem: String,
    },

    /// The bytes of the file break the format: truncated, corrupt or
    /// crafted. `context` names the metadata key, the tensor or the header
    /// field at fault.
    #[error("{file}: {context}: {problem}")]
    Malformed {
        /// The file concerned.
        file: String,
        /// The key, tensor or field at fault.
        context: String,
        /// What is wrong with it.
        problem: String,
    },

    /// A tensor has a GGML type id this reader does not know.
    #[error("{file}: {tensor}: unknown ggml type id {id}")]
    UnknownType {
        /// The file concerned.
        file: String,
        /// The tensor's name.
        tensor: String,
        /// The type id found in the file.
        id: u32,
    },

    /// A split set is inconsistent or incomplete, or a later part was
    /// opened instead of the first.
    #[error("{file}: {problem}")]
    Split {
        /// The part concerned.
        file: String,
        /// What is wrong.
        problem: String,
    },

    /// A path does not resolve to one GGUF model: a directory with none or
    /// several, for example.
    #[error("{}: {problem}", path.display())]
    Resolve {
        /// The path given.
        path: PathBuf,
        /// Why it does not resolve.
        problem: String,
    },

    /// A metadata key a caller asked for is absent.
    #[error("{file}: metadata key \"{key}\" is missing")]
    MissingKey {
        /// The file concerned.
        file: String,
        /// The key asked for.
        key: String,
    },

    /// A metadata value has a type or value the caller cannot use (a string
    /// where a number was asked for, a negative count, …).
    #[error("{file}: metadata key \"{key}\": {problem}")]
    BadValue {
        /// The file concerned.
        file: String,
        /// The key concerned.
        key: String,
        /// What is wrong with its value.
        problem: String,
    },

    /// A tensor a caller asked for is absent.
    #[error("{file}: tensor \"{name}\" is missing")]
    MissingTensor {
        /// The file concerned.
        file: String,
        /// The tensor asked for.
        name: String,
    },

    /// [`crate::GgufWriter`] was given something it cannot write (a tensor
    /// whose bytes do not match its shape, an invalid alignment, …).
    #[error("GGUF writer: {problem}")]
    Writer {
        /// What is wrong.
        problem: String,
    },
}

impl GgufError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        GgufError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn writer(problem: impl Into<String>) -> Self {
        GgufError::Writer {
            problem: problem.into(),
        }
    }
}
