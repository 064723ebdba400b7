//! `sluice perplexity`: a model's perplexity over a text file, and its KL
//! divergence from a base model, as `llama-perplexity` measures them (same
//! flags, windows, scoring and base file: `sluice_model::perplexity`).
//!
//! Without `--kl-divergence`: reads `-f FILE`, prints the running
//! perplexity per chunk and the final estimate; with `--kl-divergence-base
//! FILE`, also saves the base log probabilities there. With
//! `--kl-divergence`: reads the base file (its tokens replace `-f`) and
//! prints the comparison table and llama.cpp's statistics. `--json`
//! prints the figures as one JSON object instead.

use crate::exit::{bad_config, config_error, exit_code};
use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use sluice_model::kv_cache::KvCacheDtype;
use sluice_model::model::Model;
use sluice_model::perplexity::logits_file::BaseHeader;
use sluice_model::perplexity::scoring::{
    covariance, mean_and_uncertainty, median, percentile, KldSums,
};
use sluice_model::perplexity::{self, Evaluator, KldRun};
use sluice_model::{load_model, DType, LoadFormat, ModelSpec};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct PerplexityArgs {
    /// A GGUF file (or a directory holding one) or a Hugging Face model
    /// directory.
    #[arg(short, long, value_name = "PATH")]
    model: PathBuf,
    /// The text to evaluate (not read with --kl-divergence: the base file
    /// holds its tokens).
    #[arg(short, long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// Tokens per window (llama.cpp's -c); the second half of each is
    /// scored.
    #[arg(short = 'c', long, value_name = "N", default_value_t = 512)]
    ctx_size: usize,
    /// Evaluate at most this many windows (default: all).
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Tokens per forward pass.
    #[arg(short = 'b', long, value_name = "N", default_value_t = 2048)]
    batch_size: usize,
    /// The base log-probability file: written by a plain run, read with
    /// --kl-divergence (llama.cpp's format: either program reads the
    /// other's).
    #[arg(long, value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
    /// Compare the model with --kl-divergence-base.
    #[arg(long, requires = "kl_divergence_base")]
    kl_divergence: bool,
    /// Weight dtype: auto, f32 or bf16 (as serve takes it).
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    dtype: DType,
    /// KV cache element type (as serve takes it).
    #[arg(long, value_name = "DTYPE", default_value = "auto")]
    kv_cache_dtype: KvCacheDtype,
    /// Kernel threads (default: every core).
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    threads: Option<u32>,
    /// Print the figures as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: PerplexityArgs) -> ExitCode {
    match evaluate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice perplexity: {e:#}");
            exit_code(&e)
        }
    }
}

fn evaluate(args: &PerplexityArgs) -> Result<()> {
    if let Some(n) = args.threads {
        sluice_model::kernels::set_num_threads(n as usize);
    }
    let resolved = crate::hub::ResolvedModel {
        path: args.model.clone(),
        hub_id: None,
    };
    let spec = ModelSpec {
        dir: Some(args.model.clone()),
        builtin: None,
        load_format: LoadFormat::Auto,
        dtype: args.dtype,
        seed: 0,
        quantization: None,
    };
    let loaded = load_model(&spec)
        .with_context(|| format!("--model {}", args.model.display()))
        .map_err(config_error)?;
    let kv_dtype = crate::options::kv_dtype(args.kv_cache_dtype, &loaded.config)?;
    let tokenizer = crate::options::open_tokenizer(Some(&resolved), loaded.gguf.as_ref())?;
    let model = Model::build(&loaded)
        .with_context(|| format!("--model {}", args.model.display()))
        .map_err(config_error)?;
    // llama.cpp puts BOS in front of every window when the tokenizer adds
    // one to a text.
    let bos = tokenizer
        .add_bos_token()
        .then(|| tokenizer.bos_token_id())
        .flatten();
    let mut eval = Evaluator::new(&model, args.ctx_size, args.batch_size, bos, kv_dtype)
        .context("--ctx-size")
        .map_err(config_error)?;
    let what = json!({
        "model": args.model.display().to_string(),
        "n_ctx": args.ctx_size,
        "kv_cache_dtype": kv_dtype.name(),
    });
    if args.kl_divergence {
        compare(args, &mut eval, what)
    } else {
        score(args, &mut eval, &tokenizer, what)
    }
}

/// Plain perplexity (and the base file, when asked).
fn score(
    args: &PerplexityArgs,
    eval: &mut Evaluator<'_>,
    tokenizer: &sluice_model::tokenizer::Tokenizer,
    mut what: serde_json::Value,
) -> Result<()> {
    let Some(file) = &args.file else {
        return Err(bad_config(
            "-f/--file: the text to evaluate is required without --kl-divergence",
        ));
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--file {}", file.display()))
        .map_err(config_error)?;
    let tokens = tokenizer
        .encode(&text, true)
        .with_context(|| format!("--file {}: tokenizing", file.display()))
        .map_err(config_error)?;
    let n_chunk = perplexity::num_chunks(tokens.len(), args.ctx_size, args.chunks)
        .with_context(|| format!("--file {}", file.display()))
        .map_err(config_error)?;
    let mut base = match &args.kl_divergence_base {
        Some(p) => Some(BufWriter::new(
            File::create(p)
                .with_context(|| format!("--kl-divergence-base {}", p.display()))
                .map_err(config_error)?,
        )),
        None => None,
    };
    if !args.json {
        eprintln!(
            "perplexity: {} tokens, {n_chunk} chunks of {}, KV cache {}",
            tokens.len(),
            args.ctx_size,
            what["kv_cache_dtype"]
        );
    }
    let mut running = Vec::new();
    let json = args.json;
    let sums = perplexity::perplexity(
        eval,
        &tokens,
        n_chunk,
        base.as_mut().map(|w| w as &mut dyn Write),
        |i, s| {
            running.push(s.ppl());
            if !json {
                print!("[{}]{:.4},", i + 1, s.ppl());
                let _ = std::io::stdout().flush();
            }
        },
    )?;
    if let Some(mut w) = base {
        w.flush().context("--kl-divergence-base")?;
    }
    let (ppl, err) = sums.estimate();
    if json {
        what["tokens"] = tokens.len().into();
        what["chunks"] = n_chunk.into();
        what["scored"] = sums.count.into();
        what["ppl"] = ppl.into();
        what["ppl_err"] = err.into();
        what["ppl_by_chunk"] = running.into();
        println!("{what}");
    } else {
        println!();
        match err {
            Some(e) => println!("Final estimate: PPL = {ppl:.4} +/- {e:.5}"),
            None => println!("Final estimate: PPL = {ppl:.4}"),
        }
    }
    Ok(())
}

/// `--kl-divergence` against the base file.
fn compare(
    args: &PerplexityArgs,
    eval: &mut Evaluator<'_>,
    mut what: serde_json::Value,
) -> Result<()> {
    let path = args.kl_divergence_base.as_ref().expect("clap requires it");
    let flag = || format!("--kl-divergence-base {}", path.display());
    let mut r = BufReader::new(File::open(path).with_context(flag).map_err(config_error)?);
    let header = BaseHeader::read(&mut r)
        .with_context(flag)
        .map_err(config_error)?;
    if header.n_ctx != args.ctx_size {
        return Err(bad_config(format!(
            "{}: computed with a context of {}; pass -c {}",
            flag(),
            header.n_ctx,
            header.n_ctx
        )));
    }
    let json = args.json;
    if !json {
        println!(
            "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
        );
    }
    let run = perplexity::kl_divergence(eval, &header, &mut r, args.chunks, |i, s| {
        if !json {
            println!("{}", chunk_line(i, s));
        }
    })
    .with_context(flag)
    .map_err(config_error)?;
    let stats = KldStats::of(&run);
    if json {
        what["chunks"] = run.sums.count.checked_div(header.rows_per_chunk()).into();
        what["scored"] = run.sums.count.into();
        what["stats"] = stats.json();
        println!("{what}");
    } else {
        stats.print();
    }
    Ok(())
}

/// The figures llama.cpp prints per chunk and again at the end, each a
/// value and its uncertainty, from the running sums.
struct Headline {
    ppl: (f64, f64),
    ppl_base: (f64, f64),
    ln_ratio: (f64, f64),
    kld: (f64, f64),
    rms_p_diff: (f64, f64),
    same_top: (f64, f64),
}

impl Headline {
    fn of(s: &KldSums) -> Headline {
        let (lp, lp_u) = mean_and_uncertainty(s.sum_nll, s.sum_nll2, s.count);
        let (lb, lb_u) = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, s.count);
        let cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count);
        let (mse, mse_u) = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, s.count);
        let rms = mse.sqrt();
        let top = s.n_same_top as f64 / s.count as f64;
        Headline {
            ppl: (lp.exp(), lp.exp() * lp_u),
            ppl_base: (lb.exp(), lb.exp() * lb_u),
            ln_ratio: (lp - lb, (lp_u * lp_u + lb_u * lb_u - 2.0 * cov).sqrt()),
            kld: mean_and_uncertainty(s.sum_kld, s.sum_kld2, s.count),
            rms_p_diff: (rms, 0.5 / rms * mse_u),
            same_top: (top, (top * (1.0 - top) / (s.count as f64 - 1.0)).sqrt()),
        }
    }
}

/// One row of llama.cpp's running table.
fn chunk_line(i: usize, s: &KldSums) -> String {
    let h = Headline::of(s);
    format!(
        "{:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
        i + 1,
        h.ppl.0,
        h.ppl.1,
        h.ln_ratio.0,
        h.ln_ratio.1,
        h.kld.0,
        h.kld.1,
        100.0 * h.rms_p_diff.0,
        100.0 * h.rms_p_diff.1,
        100.0 * h.same_top.0,
        100.0 * h.same_top.1
    )
}

/// llama.cpp's closing statistics: the headline figures and the
/// quantiles of the per-position KLD and Δp.
struct KldStats {
    headline: Headline,
    kld_quantiles: Vec<(&'static str, f32)>,
    p_diff_quantiles: Vec<(&'static str, f32)>,
}

impl KldStats {
    fn of(run: &KldRun) -> KldStats {
        let quantiles =
            |v: &[f32], fractions: &[(&'static str, f32)]| -> Vec<(&'static str, f32)> {
                if v.is_empty() {
                    return Vec::new();
                }
                let mut q = vec![("max", v[v.len() - 1])];
                q.extend(fractions.iter().map(|&(n, f)| (n, percentile(v, f))));
                q.push(("median", median(v)));
                q.push(("min", v[0]));
                q
            };
        KldStats {
            headline: Headline::of(&run.sums),
            kld_quantiles: quantiles(
                &run.kld,
                &[
                    ("99.9%", 0.999),
                    ("99.0%", 0.99),
                    ("95.0%", 0.95),
                    ("90.0%", 0.9),
                    ("10.0%", 0.1),
                    ("5.0%", 0.05),
                    ("1.0%", 0.01),
                    ("0.1%", 0.001),
                ],
            ),
            p_diff_quantiles: quantiles(
                &run.p_diff,
                &[
                    ("99.9%", 0.999),
                    ("99.0%", 0.99),
                    ("95.0%", 0.95),
                    ("90.0%", 0.9),
                    ("75.0%", 0.75),
                    ("25.0%", 0.25),
                    ("10.0%", 0.1),
                    ("5.0%", 0.05),
                    ("1.0%", 0.01),
                    ("0.1%", 0.001),
                ],
            ),
        }
    }

    fn json(&self) -> serde_json::Value {
        let pair = |(v, u): (f64, f64)| json!({"value": v, "uncertainty": u});
        let q = |v: &[(&str, f32)]| {
            v.iter()
                .map(|&(n, x)| (n.to_string(), json!(x)))
                .collect::<serde_json::Map<_, _>>()
        };
        json!({
            "ppl": pair(self.headline.ppl),
            "ppl_base": pair(self.headline.ppl_base),
            "ln_ppl_ratio": pair(self.headline.ln_ratio),
            "kld": pair(self.headline.kld),
            "kld_quantiles": q(&self.kld_quantiles),
            "p_diff_quantiles": q(&self.p_diff_quantiles),
            "rms_p_diff": pair(self.headline.rms_p_diff),
            "same_top_p": pair(self.headline.same_top),
        })
    }

    fn print(&self) {
        println!();
        println!("====== Perplexity statistics ======");
        println!(
            "Mean PPL(Q)                   : {:10.6} ± {:10.6}",
            self.headline.ppl.0, self.headline.ppl.1
        );
        println!(
            "Mean PPL(base)                : {:10.6} ± {:10.6}",
            self.headline.ppl_base.0, self.headline.ppl_base.1
        );
        println!(
            "Mean ln(PPL(Q)/PPL(base))     : {:10.6} ± {:10.6}",
            self.headline.ln_ratio.0, self.headline.ln_ratio.1
        );
        println!();
        println!("====== KL divergence statistics ======");
        println!(
            "Mean    KLD: {:10.6} ± {:10.6}",
            self.headline.kld.0, self.headline.kld.1
        );
        for (n, v) in &self.kld_quantiles {
            println!("{n:<7} KLD: {v:10.6}");
        }
        println!();
        println!("====== Token probability statistics ======");
        for (n, v) in &self.p_diff_quantiles {
            println!("{n:<7} Δp: {:6.3}%", 100.0 * v);
        }
        println!(
            "RMS Δp    : {:6.3} ± {:5.3} %",
            100.0 * self.headline.rms_p_diff.0,
            100.0 * self.headline.rms_p_diff.1
        );
        println!(
            "Same top p: {:6.3} ± {:5.3} %",
            100.0 * self.headline.same_top.0,
            100.0 * self.headline.same_top.1
        );
    }
}
