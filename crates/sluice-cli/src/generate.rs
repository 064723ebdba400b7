//! `sluice generate`: offline generation through the same engine,
//! detokenizer and stop-string handling as the server.
//!
//! Every prompt (`--prompt TEXT` and `--prompt-ids 1,2,3`, in the order
//! given) is submitted at once, so they run together through the scheduler
//! as one workload. `--json` prints one JSON object per prompt, in input
//! order, when all are done; otherwise text is streamed to stdout.

use crate::exit::{bad_config, exit_code};
use crate::options::{flag_error, prepare_engine, ModelArgs, SchedulerArgs};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use sluice_core::SamplingParams;
use sluice_engine::{EngineError, GenerateRequest, RequestStream, ShutdownMode};
use sluice_structured::{Constraint, JsonFormat};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// `\n`, `\r`, `\t`, `\\`, `\"`, `\'` as the characters they name; any other
/// backslash is kept as it is.
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some(e @ ('\\' | '"' | '\'')) => out.push(e),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    if out.is_empty() {
        return Err("a stop string must not be empty".into());
    }
    Ok(out)
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub scheduler: SchedulerArgs,

    /// A prompt (repeatable). Tokenized with the model's special tokens
    /// (e.g. Llama's BOS).
    #[arg(long = "prompt", value_name = "TEXT")]
    pub prompts: Vec<String>,
    /// A prompt given as token ids, e.g. 1,2,3 (repeatable).
    #[arg(long = "prompt-ids", value_name = "IDS", value_parser = parse_ids)]
    pub prompt_ids: Vec<Vec<u32>>,

    /// Structured output: every completion is JSON matching the JSON
    /// schema in FILE.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub json_schema: Option<PathBuf>,
    /// With --json-schema: the whitespace allowed between JSON tokens, as a
    /// regex (default: one space, or up to two newlines and 20 spaces or
    /// tabs of indentation, as llama.cpp).
    #[arg(long, value_name = "RE", requires = "json_schema")]
    pub whitespace_pattern: Option<String>,
    /// Structured output: every completion matches this regex.
    #[arg(long, value_name = "RE", group = "constraint")]
    pub regex: Option<String>,
    /// Structured output: every completion is one of these strings.
    #[arg(
        long,
        value_name = "A,B,C",
        value_delimiter = ',',
        group = "constraint"
    )]
    pub choice: Option<Vec<String>>,
    /// Structured output: every completion follows the Lark grammar in FILE.
    #[arg(long, value_name = "FILE", group = "constraint")]
    pub grammar: Option<PathBuf>,

    /// Most tokens to generate per prompt.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_tokens: usize,
    /// Tokens to generate before EOS / stop tokens are allowed.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub min_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(
        long,
        value_name = "T",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability
    /// reaches P (1 disables it).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// 0 or -1 disables top-k.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub top_k: i32,
    /// Drop tokens less likely than P times the most likely one (0 disables
    /// it).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Per-request seed (prompt i uses SEED + i).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Subtracted once from the logit of every token already generated
    /// (-2 to 2; OpenAI's presence_penalty).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (-2
    /// to 2; OpenAI's frequency_penalty).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt
    /// or output by X (> 0; 1 disables it; HF's repetition_penalty).
    #[arg(
        long,
        value_name = "X",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repetition_penalty: f32,
    /// A stop string (repeatable). Escapes are processed, as llama.cpp does:
    /// `--stop '\n'` stops at a newline (\n, \r, \t, \\, \", \').
    #[arg(long, value_name = "TEXT", value_parser = unescape)]
    pub stop: Vec<String>,
    /// Keep the stop string (and EOS text) in the output.
    #[arg(long)]
    pub include_stop_str_in_output: bool,
    /// Keep generating past EOS.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Top logprobs to report per generated token.
    #[arg(long, value_name = "N")]
    pub logprobs: Option<usize>,
    /// One JSON object per prompt, in input order.
    #[arg(long)]
    pub json: bool,
}

fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    let ids: Result<Vec<u32>, String> = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| format!("{t:?} is not a token id (a non-negative integer)"))
        })
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        return Err("expected comma-separated token ids, e.g. 1,2,3".into());
    }
    Ok(ids)
}

enum PromptArg {
    Text(String),
    Ids(Vec<u32>),
}

/// The prompts in command-line order. clap keeps the two flags in separate
/// lists, so the interleaving is read back from the raw arguments.
fn prompts_in_order(args: &GenerateArgs) -> Vec<PromptArg> {
    let mut kinds = Vec::new();
    let mut raw = std::env::args().skip(1);
    while let Some(a) = raw.next() {
        match a.as_str() {
            "--" => break,
            "--prompt" | "--prompt-ids" => {
                kinds.push(a == "--prompt");
                raw.next();
            }
            _ if a.starts_with("--prompt=") => kinds.push(true),
            _ if a.starts_with("--prompt-ids=") => kinds.push(false),
            _ => {}
        }
    }
    let (mut texts, mut ids) = (args.prompts.iter(), args.prompt_ids.iter());
    let consistent = kinds.iter().filter(|k| **k).count() == args.prompts.len()
        && kinds.len() == args.prompts.len() + args.prompt_ids.len();
    if !consistent {
        kinds = vec![true; args.prompts.len()];
        kinds.extend(vec![false; args.prompt_ids.len()]);
    }
    kinds
        .into_iter()
        .filter_map(|is_text| {
            if is_text {
                texts.next().map(|t| PromptArg::Text(t.clone()))
            } else {
                ids.next().map(|i| PromptArg::Ids(i.clone()))
            }
        })
        .collect()
}

pub fn run(args: GenerateArgs) -> ExitCode {
    match generate(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            exit_code(&e)
        }
    }
}

fn generate(args: GenerateArgs) -> Result<()> {
    let prompts = prompts_in_order(&args);
    if prompts.is_empty() {
        return Err(bad_config(
            "no prompt: give --prompt TEXT or --prompt-ids 1,2,3 (each repeatable)",
        ));
    }
    let prepared = prepare_engine(&args.model, &args.scheduler)?;
    let tokenizer = prepared.tokenizer.clone();
    if !args.json {
        eprintln!(
            "sluice: model {}, {} KV blocks of {} tokens, max_model_len {}",
            prepared.model_name,
            sluice_engine::Executor::num_kv_blocks(&prepared.executor),
            prepared.config.scheduler.block_size,
            prepared.config.scheduler.max_model_len
        );
    }
    let engine = prepared.start()?;

    let base = SamplingParams {
        n: 1,
        max_tokens: args.max_tokens,
        min_tokens: args.min_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        seed: args.seed,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        repetition_penalty: args.repetition_penalty,
        ignore_eos: args.ignore_eos,
        stop: args.stop.clone(),
        include_stop_str_in_output: args.include_stop_str_in_output,
        logprobs: args.logprobs,
        ..SamplingParams::default()
    };
    let constraint = constraint(&args)?;
    if let Some(c) = &constraint {
        // Refused here, with the reason, rather than as a failed completion.
        engine
            .compile_constraint(c)
            .map_err(|e| bad_config(format!("--{}: {e}", constraint_flag(c))))?;
    }
    let mut jobs: Vec<(Vec<u32>, RequestStream)> = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        let ids = match prompt {
            PromptArg::Ids(ids) => ids,
            PromptArg::Text(text) => tokenizer.encode(&text, true)?,
        };
        let params = SamplingParams {
            seed: base.seed.map(|s| s.wrapping_add(i as u64)),
            ..base.clone()
        };
        let stream = engine
            .generate(GenerateRequest {
                structured: constraint.clone(),
                ..GenerateRequest::new(ids.clone(), params)
            })
            .map_err(|e| {
                let message = format!("prompt {}: {}", i + 1, flag_error(&e));
                // A refused request is a bad flag value (--max-tokens, ...).
                match e {
                    EngineError::Invalid(_) => bad_config(message),
                    _ => anyhow::anyhow!(message),
                }
            })?;
        jobs.push((ids, stream));
    }

    let many = jobs.len() > 1;
    let mut stdout = std::io::stdout().lock();
    let mut failed = None;
    for (i, (prompt_ids, mut stream)) in jobs.into_iter().enumerate() {
        if !args.json && many {
            writeln!(stdout, "=== prompt {} ===", i + 1)?;
        }
        let mut token_ids = Vec::new();
        let mut text = String::new();
        let mut logprobs = Vec::new();
        let mut finish = None;
        // When the first and the last output arrived: one prompt's decode
        // rate (with several, later streams are read after they ran).
        let mut first_at = None;
        let mut last_at = None;
        while let Some(out) = stream.blocking_next() {
            if !out.token_ids.is_empty() {
                let now = std::time::Instant::now();
                first_at.get_or_insert(now);
                last_at = Some(now);
            }
            token_ids.extend_from_slice(&out.token_ids);
            if args.json {
                text.push_str(&out.text);
            } else {
                write!(stdout, "{}", out.text)?;
                stdout.flush()?;
            }
            for lp in &out.logprobs {
                let mut top = lp.top.clone();
                top.sort_by(|a, b| b.logprob.total_cmp(&a.logprob));
                logprobs.push(
                    top.iter()
                        .map(|t| json!({"id": t.token_id, "logprob": t.logprob}))
                        .collect::<Vec<_>>(),
                );
            }
            if out.finished.is_some() {
                finish = out.finished;
            }
        }
        if let Some(f) = &finish {
            if let Some(err) = &f.error {
                failed.get_or_insert_with(|| format!("prompt {}: {err}", i + 1));
            }
        }
        let reason = finish.as_ref().map_or("unknown", |f| f.reason.as_str());
        if args.json {
            let obj = json!({
                "prompt_ids": prompt_ids,
                "token_ids": token_ids,
                "text": text,
                "logprobs": args.logprobs.map(|_| logprobs),
                "finish_reason": reason,
            });
            writeln!(stdout, "{obj}")?;
        } else {
            writeln!(stdout)?;
            let u = stream.usage();
            let decode = match (first_at, last_at, many) {
                (Some(a), Some(b), false) => decode_rate(u.completion_tokens, b - a),
                _ => String::new(),
            };
            eprintln!(
                "[finish_reason={reason} prompt_tokens={} completion_tokens={} cached_tokens={}{decode}]",
                u.prompt_tokens, u.completion_tokens, u.cached_tokens
            );
        }
    }
    if !args.json && args.model.speculative_config.is_some() {
        eprintln!("{}", speculation_summary(&engine.stats()));
    }
    engine.shutdown_blocking(ShutdownMode::Drain);
    match failed {
        Some(e) => bail!("{e}"),
        None => Ok(()),
    }
}

/// ` decode_tok_s=R`: tokens after the first over the time since it came
/// (empty for a single token).
fn decode_rate(tokens: usize, since_first: std::time::Duration) -> String {
    if tokens < 2 || since_first.is_zero() {
        return String::new();
    }
    format!(
        " decode_tok_s={:.1}",
        (tokens - 1) as f64 / since_first.as_secs_f64()
    )
}

/// vLLM's acceptance rate (accepted / draft tokens) and mean acceptance
/// length (1 + accepted per verification) from its three counters.
pub(crate) fn acceptance(drafts: u64, draft_tokens: u64, accepted: u64) -> (f64, f64) {
    (
        accepted as f64 / draft_tokens.max(1) as f64,
        1.0 + accepted as f64 / drafts.max(1) as f64,
    )
}

/// Speculative decoding's counters as one bracketed line: vLLM's
/// acceptance rate (accepted / draft tokens) and mean acceptance length
/// (tokens per verification, the sampled one included).
fn speculation_summary(s: &sluice_engine::EngineStats) -> String {
    let (rate, mean_len) = acceptance(
        s.spec_decode_num_drafts,
        s.spec_decode_num_draft_tokens,
        s.spec_decode_num_accepted_tokens,
    );
    format!(
        "[speculative decoding: drafts={} draft_tokens={} accepted_tokens={} \
         acceptance_rate={:.1}% mean_acceptance_length={mean_len:.2}]",
        s.spec_decode_num_drafts,
        s.spec_decode_num_draft_tokens,
        s.spec_decode_num_accepted_tokens,
        100.0 * rate
    )
}

/// The structured-output flag given, as a constraint.
fn constraint(args: &GenerateArgs) -> Result<Option<Constraint>> {
    if let Some(path) = &args.json_schema {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_config(format!("--json-schema {}: {e}", path.display())))?;
        let schema: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| bad_config(format!("--json-schema {}: not JSON: {e}", path.display())))?;
        return Ok(Some(Constraint::Json {
            schema,
            format: args
                .whitespace_pattern
                .clone()
                .map_or_else(JsonFormat::default, JsonFormat::pattern),
        }));
    }
    if let Some(re) = &args.regex {
        return Ok(Some(Constraint::Regex(re.clone())));
    }
    if let Some(choice) = &args.choice {
        return Ok(Some(Constraint::Choice(choice.clone())));
    }
    if let Some(path) = &args.grammar {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad_config(format!("--grammar {}: {e}", path.display())))?;
        return Ok(Some(Constraint::Grammar(text)));
    }
    Ok(None)
}

fn constraint_flag(c: &Constraint) -> &'static str {
    match c {
        Constraint::Json { .. } | Constraint::JsonObject { .. } => "json-schema",
        Constraint::Regex(_) => "regex",
        Constraint::Choice(_) => "choice",
        Constraint::Grammar(_) => "grammar",
    }
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn stop_strings_take_escapes() {
        assert_eq!(unescape(r"\n").unwrap(), "\n");
        assert_eq!(unescape(r"a\tb\\c").unwrap(), "a\tb\\c");
        assert_eq!(unescape(r"\x").unwrap(), r"\x");
        assert_eq!(unescape(r"end\").unwrap(), r"end\");
        assert_eq!(unescape("é\\\"").unwrap(), "é\"");
        assert!(unescape("").is_err());
    }
}
