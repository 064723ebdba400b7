//! Split sets (`NAME-00001-of-0000N.gguf`) and directory resolution.

mod common;

use common::{sample_tensors, sample_writer};
use sluice_gguf::{resolve_model_path, GgufError, GgufFile, GgufWriter, Value};
use std::path::Path;

fn write_set(dir: &Path) -> Vec<std::path::PathBuf> {
    // 9 sample tensors, at most 4 a part: 3 parts.
    sample_writer().write_split(dir, "model", 4).unwrap()
}

#[test]
fn opening_part_one_opens_the_set() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_set(dir.path());
    assert_eq!(paths.len(), 3);
    assert!(paths[0].ends_with("model-00001-of-00003.gguf"));
    assert!(paths[2].ends_with("model-00003-of-00003.gguf"));
    let f = GgufFile::open(&paths[0]).unwrap();
    assert_eq!(f.paths(), paths.as_slice());
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name()).collect();
    let expected: Vec<&str> = sample_tensors().iter().map(|t| t.0).collect();
    assert_eq!(names, expected);
    let parts: Vec<usize> = f.tensors().iter().map(|t| t.part()).collect();
    assert_eq!(parts, [0, 0, 0, 0, 1, 1, 1, 1, 2]);
    // Same bytes as the single-file version.
    let single = GgufFile::from_bytes("one", &sample_writer().to_bytes().unwrap()).unwrap();
    for (a, b) in f.tensors().iter().zip(single.tensors()) {
        assert_eq!(a.data(), b.data(), "{}", a.name());
        assert_eq!(f.tensor(a.name()).unwrap().data(), b.data());
    }
    // Metadata from the first part, split keys included.
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.metadata().u32("split.count").unwrap(), 3);
    assert_eq!(f.metadata().u32("split.tensors.count").unwrap(), 9);
    assert_eq!(f.metadata().u32("llama.block_count").unwrap(), 4);
    // Other keys under `split.` are the model's own, and kept.
    assert!(f.metadata().contains("split.note"));
    // A debug print stays short.
    assert!(format!("{f:?}").len() < 400);
    let debug = format!("{:?}", f.metadata());
    assert!(
        debug.contains(r#""general.name": "writer fixture""#),
        "{debug}"
    );
}

#[test]
fn a_one_part_set_is_a_plain_file() {
    let dir = tempfile::tempdir().unwrap();
    let paths = sample_writer().write_split(dir.path(), "m", 100).unwrap();
    assert_eq!(paths.len(), 1);
    let f = GgufFile::open(&paths[0]).unwrap();
    assert_eq!(f.tensors().len(), 9);
    assert_eq!(f.paths().len(), 1);
}

#[test]
fn opening_a_later_part_names_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_set(dir.path());
    let e = GgufFile::open(&paths[1]).unwrap_err();
    assert!(matches!(e, GgufError::Split { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("this is part 2 of 3 of a split model; open the first part")
            && e.contains("model-00001-of-00003.gguf"),
        "{e}"
    );
}

#[test]
fn a_missing_part_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_set(dir.path());
    std::fs::remove_file(&paths[2]).unwrap();
    let e = GgufFile::open(&paths[0]).unwrap_err().to_string();
    assert!(
        e.contains("part 3 of 3 is missing") && e.contains("model-00003-of-00003.gguf"),
        "{e}"
    );
}

#[test]
fn a_renamed_first_part_cannot_find_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_set(dir.path());
    let renamed = dir.path().join("renamed.gguf");
    std::fs::rename(&paths[0], &renamed).unwrap();
    let e = GgufFile::open(&renamed).unwrap_err().to_string();
    assert!(e.contains("does not end in -00001-of-00003.gguf"), "{e}");
}

/// Writes one part by hand with the given split keys.
fn write_part(path: &Path, no: u16, count: u16, total: i32, tensor: &str) {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama");
    w.add("split.no", Value::U16(no));
    w.add("split.count", Value::U16(count));
    w.add("split.tensors.count", Value::I32(total));
    w.add_tensor_f32(tensor, &[2], &[1.0, 2.0]);
    w.write(path).unwrap();
}

#[test]
fn inconsistent_sets_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p1 = d.join("x-00001-of-00002.gguf");
    let p2 = d.join("x-00002-of-00002.gguf");

    // Part 2 says it belongs to a set of 3.
    write_part(&p1, 0, 2, 2, "a");
    write_part(&p2, 1, 3, 2, "b");
    let e = GgufFile::open(&p1).unwrap_err().to_string();
    assert!(
        e.contains("x-00002-of-00002.gguf") && e.contains("does not match part 2 of 2"),
        "{e}"
    );

    // Part 2 numbered as part 1.
    write_part(&p2, 0, 2, 2, "b");
    let e = GgufFile::open(&p1).unwrap_err().to_string();
    assert!(
        e.contains("split.no 0 of split.count 2 does not match"),
        "{e}"
    );

    // The tensor total disagrees.
    write_part(&p1, 0, 2, 5, "a");
    write_part(&p2, 1, 2, 5, "b");
    let e = GgufFile::open(&p1).unwrap_err().to_string();
    assert!(
        e.contains("split.tensors.count is 5, but the 2 parts hold 2 tensors"),
        "{e}"
    );

    // The same tensor in two parts.
    write_part(&p1, 0, 2, 2, "a");
    write_part(&p2, 1, 2, 2, "a");
    let e = GgufFile::open(&p1).unwrap_err().to_string();
    assert!(
        e.contains("x-00002-of-00002.gguf: a: duplicate tensor name (first in part 1)"),
        "{e}"
    );

    // split.no out of range.
    write_part(&p1, 2, 2, 2, "a");
    let e = GgufFile::open(&p1).unwrap_err().to_string();
    assert!(e.contains("split.no is 2, but split.count is 2"), "{e}");

    // A later part without split keys.
    write_part(&p1, 0, 2, 2, "a");
    GgufWriter::new().write(&p2).unwrap();
    let e = GgufFile::open(&p1).unwrap_err().to_string();
    assert!(
        e.contains("part 2 of 2 has no split.no / split.count keys"),
        "{e}"
    );

    // Consistent at last.
    write_part(&p1, 0, 2, 2, "a");
    write_part(&p2, 1, 2, 2, "b");
    let f = GgufFile::open(&p1).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.tensor("b").unwrap().part(), 1);
}

#[test]
fn a_split_part_cannot_open_from_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_set(dir.path());
    let bytes = std::fs::read(&paths[0]).unwrap();
    let e = GgufFile::from_bytes("p1", &bytes).unwrap_err().to_string();
    assert!(e.contains("split models open from files"), "{e}");
}

#[test]
fn directories_resolve_to_their_one_model() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    let e = resolve_model_path(d).unwrap_err().to_string();
    assert!(e.contains("holds no .gguf model file"), "{e}");

    // One model beside a projector and other files.
    let model = d.join("Model-Q4_K_M.gguf");
    sample_writer().write(&model).unwrap();
    GgufWriter::new()
        .write(d.join("mmproj-model-f16.gguf"))
        .unwrap();
    std::fs::write(d.join("README.md"), "hi").unwrap();
    assert_eq!(resolve_model_path(d).unwrap(), model);
    assert_eq!(resolve_model_path(&model).unwrap(), model);
    let f = GgufFile::open(d).unwrap();
    assert_eq!(f.paths(), std::slice::from_ref(&model));

    // A second model: both are listed.
    let other = d.join("Model-Q8_0.gguf");
    sample_writer().write(&other).unwrap();
    let e = GgufFile::open(d).unwrap_err();
    assert!(matches!(e, GgufError::Resolve { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("holds 2 GGUF models (Model-Q4_K_M.gguf, Model-Q8_0.gguf)"),
        "{e}"
    );
}

#[test]
fn a_directory_of_one_split_set_opens_it() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_set(dir.path());
    GgufWriter::new()
        .write(dir.path().join("mmproj-x.gguf"))
        .unwrap();
    assert_eq!(resolve_model_path(dir.path()).unwrap(), paths[0]);
    let f = GgufFile::open(dir.path()).unwrap();
    assert_eq!(f.paths().len(), 3);
    assert_eq!(f.tensors().len(), 9);

    // Without its first part the set does not resolve.
    let moved = dir.path().join("moved.bin");
    std::fs::rename(&paths[0], &moved).unwrap();
    let e = resolve_model_path(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("parts of a split model but not its first part, model-00001-of-00003.gguf"),
        "{e}"
    );
    std::fs::rename(&moved, &paths[0]).unwrap();

    // A split set and a single file: two models.
    sample_writer()
        .write(dir.path().join("single.gguf"))
        .unwrap();
    let e = GgufFile::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("model-00001-of-00003.gguf, single.gguf"), "{e}");
}

#[cfg(unix)]
#[test]
fn symlinked_files_count() {
    // A Hugging Face cache snapshot is symbolic links to blobs.
    let blobs = tempfile::tempdir().unwrap();
    let snapshot = tempfile::tempdir().unwrap();
    let blob = blobs.path().join("abc123");
    sample_writer().write(&blob).unwrap();
    let link = snapshot.path().join("model.gguf");
    std::os::unix::fs::symlink(&blob, &link).unwrap();
    assert_eq!(resolve_model_path(snapshot.path()).unwrap(), link);
    assert_eq!(GgufFile::open(snapshot.path()).unwrap().tensors().len(), 9);
}
