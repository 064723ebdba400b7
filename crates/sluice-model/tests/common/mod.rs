//! Shared helpers of the model-correctness tests: the fixtures with their
//! transformers reference outputs, and a driver that runs requests through
//! the real `sluice_core::Scheduler` and a `ModelRunner` (schedule →
//! execute → update_from_output), the way the engine does.

#![allow(dead_code)]

use serde_json::Value;
use sluice_core::{NewRequest, SampleLogprobs, SamplingParams, Scheduler, SchedulerConfig};
use sluice_model::kernels::QuantFormat;
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::model::Model;
use sluice_model::runner::{CpuBackend, ForwardBackend, ModelRunner};
use sluice_model::weights::{SafetensorsSource, TensorSource, Weight};
use sluice_model::{load_model, DType, LoadFormat, LoadedModel, ModelSpec, WeightSource};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The dense fixtures (one KV cache group), which the scheduling scenarios
/// size their pools for.
pub const FIXTURES: &[&str] = &["tiny-qwen2", "tiny-llama", "tiny-qwen3"];
/// Every fixture with transformers references, the hybrid one (sliding
/// and full layers) included.
pub const REFERENCE_FIXTURES: &[&str] = &["tiny-qwen2", "tiny-llama", "tiny-qwen3", "tiny-gemma3"];
/// The README's suggested tolerance for an f32 engine.
pub const ATOL: f32 = 1e-4;

/// One prompt of a fixture's reference.json.
pub struct PromptRef {
    pub name: String,
    pub input_ids: Vec<u32>,
    pub greedy_token_ids: Vec<u32>,
    pub prompt_last_logits: Vec<f32>,
    /// Per greedy step, the top 5 (id, logprob), best first.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

pub struct Fixture {
    pub name: &'static str,
    pub dir: PathBuf,
    pub loaded: LoadedModel,
    /// `loaded`'s CPU model.
    pub model: Arc<Model>,
    pub prompts: Vec<PromptRef>,
    pub reference: Value,
}

pub fn data_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer") as u32)
        .collect()
}

pub fn fixture(name: &'static str) -> Fixture {
    let dir = data_dir(name);
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let reference: Value = serde_json::from_str(&text).expect("reference.json parses");
    let prompts = reference["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| PromptRef {
            name: p["name"].as_str().unwrap().to_string(),
            input_ids: u32s(&p["input_ids"]),
            greedy_token_ids: u32s(&p["greedy_token_ids"]),
            prompt_last_logits: p["prompt_last_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
            top_logprobs: p["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|step| {
                    step.as_array()
                        .unwrap()
                        .iter()
                        .map(|e| {
                            (
                                e["id"].as_u64().unwrap() as u32,
                                e["logprob"].as_f64().unwrap() as f32,
                            )
                        })
                        .collect()
                })
                .collect(),
        })
        .collect();
    let loaded = load_model(&ModelSpec {
        dir: Some(dir.clone()),
        builtin: None,
        load_format: LoadFormat::Auto,
        dtype: DType::F32,
        seed: 0,
        quantization: None,
    })
    .expect("fixture loads");
    let model = Arc::new(Model::build(&loaded).expect("fixture's weights load"));
    Fixture {
        name,
        dir,
        loaded,
        model,
        prompts,
        reference,
    }
}

/// `Model::forward` on one prompt with a fresh cache: the logits at the last
/// prompt position. Blocks 1.. (0 is the null block) are handed out in
/// reverse, so the table, not the order, decides where tokens live; each KV
/// cache group (a hybrid model's sliding and full layers) gets its own.
pub fn prompt_last_logits(model: &Model, prompt: &[u32]) -> Vec<f32> {
    use sluice_model::kv_cache::KvCache;
    use sluice_model::model::ForwardBatch;
    let block_size = 16;
    let groups = model.config.kv_layer_groups(Default::default()).specs.len();
    let per_group = prompt.len().div_ceil(block_size);
    let num_blocks = groups * per_group + 1;
    let mut kv = KvCache::new(&model.config, KvCacheConfig::new(block_size, num_blocks)).unwrap();
    let all: Vec<u32> = (1..num_blocks as u32).rev().collect();
    let tables: Vec<&[u32]> = all.chunks(per_group).collect();
    let mut batch = ForwardBatch::default();
    batch
        .push_seq_groups(prompt, 0, &tables, block_size)
        .unwrap();
    batch.logits_rows.push(prompt.len() - 1);
    model.forward(&batch, &mut kv).unwrap()
}

/// Greedy, EOS ignored, `max_tokens` tokens, top-5 logprobs.
pub fn greedy_params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        logprobs: Some(5),
        ..SamplingParams::greedy(max_tokens)
    }
}

pub fn scheduler_config(block_size: usize, num_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        block_size,
        num_gpu_blocks: num_blocks,
        max_model_len: 512,
        max_num_seqs: 16,
        max_num_batched_tokens: 2048,
        ..SchedulerConfig::default()
    }
}

/// What one request produced.
#[derive(Clone, Debug, Default)]
pub struct Finished {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Option<SampleLogprobs>>,
    pub num_cached_tokens: usize,
}

/// Scheduler + runner (on the CPU model unless another backend is given),
/// stepped like the engine's loop.
pub struct Driver<B: ForwardBackend = CpuBackend> {
    pub sched: Scheduler,
    pub runner: ModelRunner<B>,
    pub results: HashMap<String, Finished>,
    pub steps: usize,
}

impl Driver {
    pub fn new(loaded: &LoadedModel, config: SchedulerConfig) -> Self {
        let kv = KvCacheConfig::new(config.block_size, config.num_gpu_blocks);
        let runner = ModelRunner::new(loaded, kv).expect("runner");
        Driver::with_runner(runner, config)
    }
}

impl<B: ForwardBackend> Driver<B> {
    /// The scheduler manages the KV cache groups the runner's model forms
    /// (a hybrid model's sliding layers free their out-of-window blocks).
    pub fn with_runner(runner: ModelRunner<B>, mut config: SchedulerConfig) -> Self {
        assert_eq!(runner.num_kv_blocks(), config.num_gpu_blocks);
        config.kv_cache_groups = runner.kv_cache_groups();
        Driver {
            sched: Scheduler::new(config).expect("scheduler"),
            runner,
            results: HashMap::new(),
            steps: 0,
        }
    }

    pub fn add(&mut self, id: &str, prompt: &[u32], params: SamplingParams) {
        self.sched
            .add_request(NewRequest::new(id, prompt.to_vec(), params))
            .expect("request accepted");
        self.results.insert(id.to_string(), Finished::default());
    }

    /// One schedule → execute → update_from_output round; returns the
    /// number of tokens scheduled.
    pub fn step(&mut self) -> usize {
        let so = self.sched.schedule();
        let out = self.runner.execute(&so).expect("execute");
        let updates = self.sched.update_from_output(&so, &out);
        for u in updates {
            let r = self.results.get_mut(&*u.req_id).expect("known request");
            r.tokens.extend_from_slice(&u.new_token_ids);
            if let Some(lp) = out.sample_logprobs(u.index) {
                r.logprobs.extend_from_slice(lp);
            }
            if r.num_cached_tokens == 0 {
                r.num_cached_tokens = u.num_cached_tokens;
            }
        }
        self.steps += 1;
        so.total_num_scheduled_tokens
    }

    pub fn run(&mut self) {
        let mut idle = 0;
        while self.sched.has_unfinished_requests() {
            if self.step() == 0 {
                idle += 1;
                assert!(idle < 3, "scheduler made no progress");
            } else {
                idle = 0;
            }
            assert!(self.steps < 100_000, "runaway loop");
        }
        // One more schedule() delivers the last finished ids to the runner.
        self.step();
    }
}

/// Runs each prompt alone (the baseline every other scenario is compared to).
pub fn single_runs(f: &Fixture, max_tokens: usize) -> Vec<Finished> {
    f.prompts
        .iter()
        .map(|p| {
            let mut d = Driver::new(&f.loaded, scheduler_config(16, 64));
            d.add(&p.name, &p.input_ids, greedy_params(max_tokens));
            d.run();
            d.results.remove(&p.name).unwrap()
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A fixture's checkpoint, but v_proj and up_proj handed out in bf16 while
/// everything else stays f32: what a GGUF source does with a file that
/// stores the parts of one layer in different formats.
pub struct MixedFormats(pub SafetensorsSource);

impl TensorSource for MixedFormats {
    fn read_into(&self, name: &str, shape: &[usize], out: &mut Weight) -> anyhow::Result<()> {
        self.0.read_into(name, shape, out)
    }

    fn contains(&self, name: &str) -> bool {
        self.0.contains(name)
    }

    fn format_of(&self, name: &str, requested: QuantFormat) -> anyhow::Result<QuantFormat> {
        let bf16 = name.contains("v_proj") || name.contains("up_proj");
        Ok(if bf16 { QuantFormat::Bf16 } else { requested })
    }
}

/// The fixture's model described with [`MixedFormats`] as its tensor
/// source (q/k/v and gate/up become linear layers of parts).
pub fn mixed_formats(f: &Fixture) -> LoadedModel {
    let source = MixedFormats(SafetensorsSource::open(&f.dir).unwrap());
    LoadedModel {
        config: f.loaded.config.clone(),
        generation_config: f.loaded.generation_config.clone(),
        weights: WeightSource::new(source, QuantFormat::F32),
        dir: None,
        gguf: None,
    }
}
