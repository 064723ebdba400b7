//! `sluice`: the command-line entry point. Each subcommand lives in its own
//! module with its own arguments.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod replay;

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
    /// Replay a scheduler trace and write its decision log.
    Replay(replay::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Replay(args) => replay::run(args),
    }
}
