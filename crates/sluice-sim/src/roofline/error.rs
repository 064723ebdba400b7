//! [`RooflineError`]: why a roofline could not be set up or a KV cache
//! sized, each variant saying which setting is at fault.

/// What can go wrong setting up a roofline or sizing a KV cache.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RooflineError {
    #[error("tensor parallel size must be at least 1")]
    ZeroTensorParallel,
    #[error("the model's {heads} attention heads are not divisible by tensor parallel size {tp}")]
    HeadsNotDivisible { heads: usize, tp: usize },
    #[error(
        "the model's {kv_heads} KV heads and tensor parallel size {tp}: one must divide the other"
    )]
    KvHeadsNotDivisible { kv_heads: usize, tp: usize },
    #[error("--gpu-memory-utilization {0}: expected a fraction in (0, 1]")]
    BadUtilization(f64),
    #[error("block size must be at least 1")]
    ZeroBlockSize,
    #[error("model shape: {0}")]
    BadShape(String),
    #[error(
        "the weights ({weights_gb:.1} GB per GPU) and the {reserve_gb:.1} GB activation reserve do not fit in {memory_gb:.1} GB × {utilization} = {requested_gb:.1} GB"
    )]
    WeightsDoNotFit {
        weights_gb: f64,
        reserve_gb: f64,
        memory_gb: f64,
        utilization: f64,
        requested_gb: f64,
    },
    #[error(
        "{available_gb:.3} GB per GPU is left for the KV cache, less than one block ({block_bytes} bytes: {block_size} tokens × {kv_per_token} bytes per token per GPU)"
    )]
    NoRoomForABlock {
        available_gb: f64,
        block_bytes: u64,
        block_size: usize,
        kv_per_token: usize,
    },
}
