//! A sample run: Qwen2.5-7B on one H100, `vllm bench serve`'s random
//! dataset 1024 → 128 at 8 req/s, printed as the `--save-result` JSON
//! plus the simulator's own speed.

use sluice_core::SchedulerConfig;
use sluice_sim::{Hardware, ModelShape, RandomWorkload, Roofline, SimReport, Simulator};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let w = RandomWorkload {
        num_prompts: 1000,
        input_len: 1024,
        output_len: 128,
        request_rate: 8.0,
        seed: 0,
        ..RandomWorkload::default()
    };
    let reqs = w.generate()?;
    let config = SchedulerConfig {
        // About what 7B bf16 leaves of 80 GB at 0.9 utilisation:
        // (72 − 15) GB ÷ 56 KiB per token ÷ 16 tokens per block.
        num_gpu_blocks: 60_000,
        max_model_len: 4096,
        ..SchedulerConfig::default()
    };
    let sim = Simulator::new(
        config,
        Roofline::new(ModelShape::QWEN2_5_7B, Hardware::H100_SXM),
    );
    let t0 = Instant::now();
    let res = sim.run(&reqs)?;
    let wall = t0.elapsed().as_secs_f64();
    let report = SimReport::from_result(&res);
    println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    println!(
        "simulated {} steps in {:.3} s wall: {:.0} steps/s",
        res.steps.len(),
        wall,
        res.steps.len() as f64 / wall
    );
    Ok(())
}
