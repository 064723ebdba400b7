//! The backend registry: `cpu` by default, a second backend registered by
//! a caller is built by name with the same request, and an unknown name is
//! an error that lists the known ones.

use anyhow::Result;
use sluice_core::Executor;
use sluice_model::model::ForwardBatch;
use sluice_model::runner::{
    BackendEntry, BackendRegistry, BackendRequest, ForwardBackend, ModelRunner,
};
use sluice_model::{DType, KvCacheSize, ModelExecutor};
use std::ops::Range;

/// A backend that computes nothing: every logits row prefers token 0 of a
/// 97-token vocabulary.
struct Fake {
    block_size: usize,
    num_blocks: usize,
    rows: usize,
}

impl ForwardBackend for Fake {
    fn vocab_size(&self) -> usize {
        97
    }
    fn num_kv_blocks(&self) -> usize {
        self.num_blocks
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<()> {
        self.rows = batch.logits_rows.len();
        Ok(())
    }
    fn logits(&mut self, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        assert!(rows.end <= self.rows);
        out.clear();
        for _ in rows {
            out.push(1.0);
            out.extend(std::iter::repeat_n(0.0, 96));
        }
        Ok(())
    }
}

fn fake(req: &BackendRequest<'_>) -> Result<Box<dyn Executor>> {
    let num_blocks = match req.kv_cache_size {
        KvCacheSize::Blocks(n) => n,
        KvCacheSize::Bytes(b) => b / 4096,
    };
    let backend = Fake {
        block_size: req.block_size,
        num_blocks,
        rows: 0,
    };
    Ok(Box::new(ModelExecutor::from_runner(
        ModelRunner::with_backend(backend).with_seed(req.seed),
    )))
}

#[test]
fn backends_are_built_by_name() {
    let (config, generation) = sluice_model::builtin::config("tiny").unwrap();
    let vocab = config.vocab_size;
    assert_ne!(vocab, 97);
    let loaded = sluice_model::load_dummy(config, generation, DType::Auto, 0).unwrap();
    let request = BackendRequest {
        model: &loaded,
        block_size: 16,
        kv_cache_size: KvCacheSize::Blocks(12),
        seed: 0,
    };
    let mut registry = BackendRegistry::default();
    assert_eq!(registry.names(), ["cpu"]);
    let cpu = registry.create("cpu", &request).unwrap();
    assert_eq!((cpu.num_kv_blocks(), cpu.vocab_size()), (12, Some(vocab)));

    let e = registry.create("fake", &request).err().unwrap().to_string();
    assert_eq!(e, "unknown backend \"fake\" (known: cpu)");
    registry.register(BackendEntry {
        name: "fake",
        description: "test double",
        factory: fake,
    });
    assert_eq!(registry.names(), ["cpu", "fake"]);
    let f = registry.create("fake", &request).unwrap();
    assert_eq!((f.num_kv_blocks(), f.vocab_size()), (12, Some(97)));
    let e = registry.get("cuda").err().unwrap().to_string();
    assert_eq!(e, "unknown backend \"cuda\" (known: cpu, fake)");
}
