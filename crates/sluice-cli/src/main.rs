//! `sluice`: the command-line entry point. Each subcommand lives in its own
//! module with its own arguments.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench;
mod bench_model;
mod exit;
mod generate;
mod hub;
mod options;
mod perplexity;
mod replay;
mod serve;
mod simulate;
mod simulated;
mod startup;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "An LLM serving engine with a vLLM-equivalent scheduler"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI-compatible HTTP API (the built-in tiny model when no
    /// --model is given).
    Serve(serve::ServeArgs),
    /// Replay a scheduler trace and write its decision log.
    Replay(replay::ReplayArgs),
    /// Generate text offline (no server) with the serving engine.
    Generate(generate::GenerateArgs),
    /// Benchmark the model runner on a model file (GGUF or Hugging Face
    /// directory) or a built-in shape with dummy weights (prefill, decode at
    /// several concurrency levels, peak memory, the bandwidth bound).
    BenchModel(bench_model::BenchModelArgs),
    /// Benchmark an OpenAI-compatible server (sluice, vLLM, ...) as `vllm
    /// bench serve` does, with sluice's load-test extras.
    Bench(bench::BenchArgs),
    /// Simulate serving at GPU and cluster scale on the real scheduler
    /// (a step-time model instead of the GPU, a virtual clock), or fit a
    /// step-time profile to a `serve --step-log` file (`simulate fit`).
    Simulate(simulate::SimulateArgs),
    /// A model's perplexity over a text file, and its KL divergence from
    /// a base model's saved log probabilities, as llama.cpp's
    /// llama-perplexity measures them (its flags and base file format).
    Perplexity(perplexity::PerplexityArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Generate(args) => generate::run(args),
        Command::BenchModel(args) => bench_model::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Perplexity(args) => perplexity::run(args),
    }
}
