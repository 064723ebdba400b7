//! The backend registry: `cpu` by default, a second backend registered by
//! a caller is built by name with the same request, and an unknown name is
//! an error that lists the known ones. And the loaded model is a
//! description: a second backend reads its own weights from the same
//! tensor source the CPU backend reads.

use anyhow::Result;
use sluice_core::Executor;
use sluice_model::kernels::QuantFormat;
use sluice_model::model::{ForwardBatch, Model};
use sluice_model::runner::{
    BackendEntry, BackendRegistry, BackendRequest, ForwardBackend, ModelRunner,
};
use sluice_model::weights::Weight;
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
        grouping: Default::default(),
        kv_dtype: sluice_model::kv_cache::KvDtype::Q8_0,
        seed: 0,
        speculation: None,
    };
    let mut registry = BackendRegistry::default();
    assert_eq!(registry.names(), ["cpu"]);
    let cpu = registry.create("cpu", &request).unwrap();
    assert_eq!((cpu.num_kv_blocks(), cpu.vocab_size()), (12, Some(vocab)));
    // The element type the request asked for reaches the executor.
    assert_eq!(cpu.kv_cache_dtype(), Some("q8_0"));

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

/// A backend that turns the description into its own weights: the
/// embedding matrix alone, read from the model's tensor source as f32, and
/// logits `E · E[t]` for the last token `t` of each row (a zero-layer model
/// with a tied head and no norm).
struct Bigram {
    vocab: usize,
    hidden: usize,
    embedding: Vec<f32>,
    last_tokens: Vec<u32>,
}

impl Bigram {
    fn from_description(model: &sluice_model::LoadedModel) -> Result<Self> {
        let (vocab, hidden) = (model.config.vocab_size, model.config.hidden_size);
        let mut w = Weight::empty(QuantFormat::F32, vocab * hidden);
        model
            .weights
            .tensors
            .read_into("model.embed_tokens.weight", &[vocab, hidden], &mut w)?;
        let Weight::F32(embedding) = w else {
            anyhow::bail!("asked for f32, got {:?}", w.dtype());
        };
        Ok(Bigram {
            vocab,
            hidden,
            embedding,
            last_tokens: Vec::new(),
        })
    }
}

impl ForwardBackend for Bigram {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn num_kv_blocks(&self) -> usize {
        8
    }
    fn block_size(&self) -> usize {
        16
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<()> {
        self.last_tokens = batch
            .logits_rows
            .iter()
            .map(|&r| batch.input_ids[r])
            .collect();
        Ok(())
    }
    fn logits(&mut self, rows: Range<usize>, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        let h = self.hidden;
        for &t in &self.last_tokens[rows] {
            let e = &self.embedding[t as usize * h..][..h];
            out.extend(
                self.embedding
                    .chunks_exact(h)
                    .map(|row| row.iter().zip(e).map(|(a, b)| a * b).sum::<f32>()),
            );
        }
        Ok(())
    }
}

#[test]
fn a_second_backend_reads_its_weights_from_the_description() {
    // A checkpoint on disk (transformers' safetensors), so a missing tensor
    // is missing.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-qwen2");
    let loaded = sluice_model::load_model(&sluice_model::ModelSpec {
        dir: Some(dir),
        dtype: DType::F32,
        ..Default::default()
    })
    .unwrap();
    let mut bigram = Bigram::from_description(&loaded).unwrap();
    assert_eq!(bigram.vocab_size(), loaded.config.vocab_size);

    let prompt = [3u32, 41, 5];
    let mut batch = ForwardBatch::default();
    batch.push_seq(&prompt, 0, &[1], 16).unwrap();
    batch.logits_rows.push(prompt.len() - 1);
    bigram.forward(&batch).unwrap();
    let mut logits = Vec::new();
    bigram.logits(0..1, &mut logits).unwrap();

    // The CPU backend's weights of the same description: the same
    // embedding, read through the model loader.
    let cpu = Model::build(&loaded).unwrap();
    let Weight::F32(e) = &cpu.embed_tokens else {
        panic!("f32 embedding expected");
    };
    let h = loaded.config.hidden_size;
    let last = &e[5 * h..6 * h];
    let brute: Vec<f32> = (0..loaded.config.vocab_size)
        .map(|j| (0..h).map(|k| e[j * h + k] * last[k]).sum())
        .collect();
    assert_eq!(logits.len(), brute.len());
    let worst = logits
        .iter()
        .zip(&brute)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst < 1e-5, "{worst}");
    assert!(
        brute.iter().any(|&x| x != 0.0),
        "trained weights, not zeros"
    );

    // A tensor the source lacks is an error naming it.
    let mut w = Weight::empty(QuantFormat::F32, 1);
    let err = loaded
        .weights
        .tensors
        .read_into("no.such.weight", &[1], &mut w)
        .map(|_| ())
        .unwrap_err();
    assert!(format!("{err:#}").contains("no.such.weight"), "{err:#}");
}
