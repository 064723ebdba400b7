//! `sluice bench`'s flags — `vllm bench serve`'s (vLLM 0.33.0) under the
//! same names, defaults and meaning, plus sluice's own load-test extras —
//! and their validation into a [`Config`], every error naming its flag.

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{Map, Value};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The completions API (`/v1/completions`).
    #[value(name = "openai")]
    Openai,
    /// The chat completions API (`/v1/chat/completions`).
    #[value(name = "openai-chat")]
    OpenaiChat,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Openai => "openai",
            Backend::OpenaiChat => "openai-chat",
        }
    }
    fn default_endpoint(self) -> &'static str {
        match self {
            Backend::Openai => "/v1/completions",
            Backend::OpenaiChat => "/v1/chat/completions",
        }
    }
    /// The URL suffix vLLM's request function insists on.
    fn endpoint_suffix(self) -> &'static str {
        match self {
            Backend::Openai => "completions",
            Backend::OpenaiChat => "chat/completions",
        }
    }
}

const AFTER_HELP: &str = "\
Measures as `vllm bench serve` (vLLM 0.33.0) does: same flags, same random \
dataset (token-id prompts from NumPy's seeded streams, bit for bit), same \
arrival process, same TTFT / TPOT / ITL / E2EL definitions, same summary \
table and result-file keys.

Tokenizer: --tokenizer takes a GGUF file (the tokenizer it carries, the one \
`sluice serve --model FILE.gguf` uses), a Hugging Face tokenizer directory \
(tokenizer.json), or a Hugging Face Hub id ORG/NAME (its tokenizer files \
only, into the Hugging Face cache; HF_HUB_OFFLINE applies). Without it, the \
model id when it is such a local path (as vLLM uses the model id). Else the \
server's own POST /tokenize measures the prompts (sluice and vLLM serve it): \
each is drafted as text, tokenized there, cut to its length in the server's \
tokens (POST /detokenize) and checked again, so it has the requested length \
in the server's tokens without a local copy of the tokenizer; a server \
without /tokenize gets the built-in byte-level prompts, unmeasured. With a \
local tokenizer, as vLLM does, the first prompt is checked against \
/tokenize and all prompts are cut to the server's lengths on a mismatch. The \
summary's sluice section gives the requested prompt length and the achieved \
one (mean, standard deviation, min and max of the server's usage \
prompt_tokens).

Progress: a bar of finished requests on stderr when stderr is a terminal \
(--disable-tqdm hides it, as in vLLM); none otherwise.

Peak concurrent requests (vLLM's rule): the run is cut into whole seconds \
from the first successful request's start, a successful request counts as \
active in every second from the one it starts in to the one it ends in, and \
the figure is the most requests active in one second; so requests that \
follow each other within a second both count, and it can exceed \
--max-concurrency. (Peak output token throughput counts output chunks per \
second the same way.)

Output: the summary table on stdout, then one JSON line (the result-file \
object without the per-request arrays, plus sluice's extras). --save-result \
writes the result file (per-request arrays with --save-detailed, as in \
vLLM). Progress and notes go to stderr.

Exit status: 2 for a bad flag (a value that does not parse, an unknown \
dataset, a --tokenizer that does not exist or holds no tokenizer); 1 when a \
request failed other than by a 503, when --check-kv-drain found the server \
not drained, or when the server or the hub cannot be reached.";

#[derive(Args, Clone, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct BenchArgs {
    /// The API to drive: openai (completions) or openai-chat.
    #[arg(long, value_enum, default_value = "openai")]
    pub backend: Backend,
    /// Server base URL (without /v1); overrides --host and --port.
    #[arg(long, alias = "url", value_name = "URL")]
    pub base_url: Option<String>,
    /// Server host, without --base-url.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Server port, without --base-url.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API path [default: /v1/completions for openai, /v1/chat/completions
    /// for openai-chat]. (vLLM's default is /v1/completions for every
    /// backend, so it needs this flag with openai-chat.)
    #[arg(long, value_name = "PATH")]
    pub endpoint: Option<String>,
    /// Model to ask for [default: the first of the server's /v1/models].
    #[arg(long)]
    pub model: Option<String>,
    /// The name sent as `model` when it differs from --model.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// The tokenizer that builds the prompts (and counts output tokens when
    /// the server sends no usage): a GGUF file, a Hugging Face tokenizer
    /// directory, or a hub id ORG/NAME [default: the model id when it is a
    /// local path, else the server's /tokenize].
    #[arg(long, value_name = "FILE.gguf|DIR|ORG/NAME")]
    pub tokenizer: Option<String>,
    /// Only `random` (token-id prompts) is implemented.
    #[arg(long, default_value = "random", value_parser = ["random"])]
    pub dataset_name: String,
    /// Prompt tokens per request (the sampled part, special tokens
    /// included).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub random_input_len: usize,
    /// Output tokens per request (max_tokens).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths are drawn uniformly from [len*(1-r), len*(1+r)]: one number
    /// for both, or '{"input": 0.3, "output": 0.5}'. In [0, 1).
    #[arg(long, value_name = "R", default_value = "0.0")]
    pub random_range_ratio: String,
    /// Fixed random tokens before every prompt (a shared prefix).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub random_prefix_len: usize,
    /// Sets --random-input-len.
    #[arg(long, value_name = "N")]
    pub input_len: Option<usize>,
    /// Sets --random-output-len.
    #[arg(long, value_name = "N")]
    pub output_len: Option<usize>,
    /// Requests to send.
    #[arg(long, alias = "num-requests", value_name = "N", default_value_t = 1000)]
    pub num_prompts: usize,
    /// Most requests in flight [default: no limit].
    #[arg(long, alias = "concurrency", value_name = "N")]
    pub max_concurrency: Option<usize>,
    /// Requests per second: inf sends all at once; otherwise arrivals are a
    /// Poisson process (or gamma, see --burstiness).
    #[arg(long, value_name = "RPS", default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Gamma shape of the inter-arrival times: 1 is Poisson, below 1
    /// burstier, above 1 more uniform. Only with a finite --request-rate.
    #[arg(long, value_name = "B", default_value_t = 1.0)]
    pub burstiness: f64,
    /// Send ignore_eos. (With --dataset-name random vLLM always does, and so
    /// does this.)
    #[arg(long)]
    pub ignore_eos: bool,
    /// Metrics to report percentiles of: ttft, tpot, itl, e2el,
    /// client_queue_time, e2el_including_client_queue [default:
    /// ttft,tpot,itl].
    #[arg(long, value_name = "LIST")]
    pub percentile_metrics: Option<String>,
    /// Percentiles to report, e.g. 25,50,75.
    #[arg(long, value_name = "LIST", default_value = "99")]
    pub metric_percentiles: String,
    /// Seed of the dataset and of the arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u32,
    /// Requests sent before the measured run (the first prompt each time).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub num_warmups: usize,
    /// Write the result JSON file.
    #[arg(long)]
    pub save_result: bool,
    /// Include the per-request arrays (input_lens, output_lens, ttfts,
    /// itls, start_times, generated_texts, errors) in the result file.
    #[arg(long)]
    pub save_detailed: bool,
    /// Directory of the result file [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub result_dir: Option<PathBuf>,
    /// Result file name [default:
    /// {label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json].
    #[arg(long, value_name = "NAME")]
    pub result_filename: Option<String>,
    /// Label (file-name prefix) of the result [default: --backend].
    #[arg(long)]
    pub label: Option<String>,
    /// Prefix of the x-request-id header [default: bench-XXXXXXXX-].
    #[arg(long, value_name = "PREFIX")]
    pub request_id_prefix: Option<String>,
    /// Logprobs per token (completions only).
    #[arg(long, value_name = "N")]
    pub logprobs: Option<u32>,
    /// Sampling temperature [default: the server's].
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Sampling top_p [default: the server's].
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Sampling top_k [default: the server's].
    #[arg(long)]
    pub top_k: Option<i64>,
    /// Sampling min_p [default: the server's].
    #[arg(long)]
    pub min_p: Option<f64>,
    /// [default: the server's]
    #[arg(long)]
    pub frequency_penalty: Option<f64>,
    /// [default: the server's]
    #[arg(long)]
    pub presence_penalty: Option<f64>,
    /// Replaces the 1.0 the completions payload always carries [default:
    /// the server's].
    #[arg(long)]
    pub repetition_penalty: Option<f64>,
    /// No progress bar (there is one on stderr only when stderr is a
    /// terminal).
    #[arg(long)]
    pub disable_tqdm: bool,

    // sluice's extras.
    /// (sluice) Fraction of requests whose client hangs up after the first
    /// output chunk; counted apart, neither successes nor failures.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub disconnect_fraction: f64,
    /// (sluice) After the run, poll /metrics until vllm:kv_cache_usage_perc,
    /// vllm:num_requests_running and vllm:num_requests_waiting are 0; fail
    /// if they are not within 30 s.
    #[arg(long)]
    pub check_kv_drain: bool,
    /// (sluice) The server's process, to report its VmRSS before and after:
    /// a pid (`sluice serve` prints its own when it starts listening), a
    /// file holding one, or `auto` (the local process listening on the
    /// URL's port).
    #[arg(long, value_name = "PID|FILE|auto")]
    pub server_pid: Option<String>,
    /// Always on (streaming is how TTFT is measured); kept for old scripts.
    #[arg(long, hide = true)]
    pub stream: bool,
}

/// The validated run.
#[derive(Clone, Debug)]
pub struct Config {
    pub backend: Backend,
    pub base_url: String,
    pub api_url: String,
    pub model: Option<String>,
    pub served_model_name: Option<String>,
    pub tokenizer: Option<String>,
    pub disable_tqdm: bool,
    pub input_len: usize,
    pub output_len: usize,
    pub range_ratio: (f64, f64),
    pub prefix_len: usize,
    pub num_prompts: usize,
    pub max_concurrency: Option<usize>,
    pub request_rate: f64,
    pub burstiness: f64,
    pub ignore_eos: bool,
    pub percentile_metrics: Vec<String>,
    pub percentiles: Vec<f64>,
    pub seed: u32,
    pub num_warmups: usize,
    pub save_result: bool,
    pub save_detailed: bool,
    pub result_dir: Option<PathBuf>,
    pub result_filename: Option<String>,
    pub label: Option<String>,
    pub request_id_prefix: String,
    pub logprobs: Option<u32>,
    pub extra_body: Map<String, Value>,
    pub disconnect_fraction: f64,
    pub check_kv_drain: bool,
    pub server_pid: Option<String>,
}

pub const METRIC_NAMES: [&str; 6] = [
    "ttft",
    "tpot",
    "itl",
    "e2el",
    "client_queue_time",
    "e2el_including_client_queue",
];

/// `--random-range-ratio`: a number, or a JSON object with `input` and
/// `output`; each in [0, 1).
pub fn parse_range_ratio(s: &str) -> Result<(f64, f64)> {
    let (i, o) = match s.trim().parse::<f64>() {
        Ok(r) => (r, r),
        Err(_) => {
            let v: Value = serde_json::from_str(s).with_context(|| {
                format!(
                    "--random-range-ratio: {s:?} is neither a number nor a JSON object \
                     like {{\"input\": 0.3, \"output\": 0.5}}"
                )
            })?;
            let get = |k: &str| {
                v.get(k).and_then(Value::as_f64).with_context(|| {
                    format!("--random-range-ratio: the object needs a number `{k}`")
                })
            };
            (get("input")?, get("output")?)
        }
    };
    for (name, r) in [("input", i), ("output", o)] {
        if !(0.0..1.0).contains(&r) {
            bail!("--random-range-ratio: the {name} ratio {r} is not in [0, 1)");
        }
    }
    Ok((i, o))
}

/// A random 8-hex-digit tag, like vLLM's `uuid4().hex[:8]`.
fn random_tag() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    format!("{:08x}", h.finish() as u32)
}

/// `http://HOST:PORT`, bracketing an IPv6 host.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl BenchArgs {
    pub fn validate(&self) -> Result<Config> {
        let base_url = match &self.base_url {
            Some(u) => {
                let u = u.trim_end_matches('/');
                if !(u.starts_with("http://") || u.starts_with("https://")) {
                    bail!("--base-url: {u:?} must start with http:// or https://");
                }
                u.to_string()
            }
            None => format!("http://{}", join_host_port(&self.host, self.port)),
        };
        let endpoint = self
            .endpoint
            .clone()
            .unwrap_or_else(|| self.backend.default_endpoint().to_string());
        if !endpoint.ends_with(self.backend.endpoint_suffix()) {
            bail!(
                "--endpoint: {endpoint:?} does not end with {:?}, which --backend {} needs",
                self.backend.endpoint_suffix(),
                self.backend.name()
            );
        }
        if self.num_prompts == 0 {
            bail!("--num-prompts must be at least 1");
        }
        if self.max_concurrency == Some(0) {
            bail!("--max-concurrency must be greater than 0");
        }
        if self.request_rate.is_nan() || self.request_rate <= 0.0 {
            bail!(
                "--request-rate must be positive (or inf), not {}",
                self.request_rate
            );
        }
        if self.burstiness.is_nan() || self.burstiness <= 0.0 {
            bail!("--burstiness must be positive, not {}", self.burstiness);
        }
        if !(0.0..=1.0).contains(&self.disconnect_fraction) {
            bail!(
                "--disconnect-fraction must be in [0, 1], not {}",
                self.disconnect_fraction
            );
        }
        let percentile_metrics: Vec<String> = self
            .percentile_metrics
            .as_deref()
            .unwrap_or("ttft,tpot,itl")
            .split(',')
            .map(|m| m.trim().to_string())
            .collect();
        for m in &percentile_metrics {
            if !METRIC_NAMES.contains(&m.as_str()) {
                bail!(
                    "--percentile-metrics: unknown metric {m:?} (known: {})",
                    METRIC_NAMES.join(", ")
                );
            }
        }
        let mut percentiles = Vec::new();
        for p in self.metric_percentiles.split(',') {
            let v: f64 = p
                .trim()
                .parse()
                .with_context(|| format!("--metric-percentiles: {p:?} is not a number"))?;
            if !(0.0..=100.0).contains(&v) {
                bail!("--metric-percentiles: {v} is not in [0, 100]");
            }
            percentiles.push(v);
        }
        let mut extra_body = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                extra_body.insert(k.to_string(), v);
            }
        };
        let num = |v: Option<f64>| v.map(Value::from);
        put("top_p", num(self.top_p));
        put("top_k", self.top_k.map(Value::from));
        put("min_p", num(self.min_p));
        put("temperature", num(self.temperature));
        put("frequency_penalty", num(self.frequency_penalty));
        put("presence_penalty", num(self.presence_penalty));
        put("repetition_penalty", num(self.repetition_penalty));
        Ok(Config {
            backend: self.backend,
            api_url: format!("{base_url}{endpoint}"),
            base_url,
            model: self.model.clone(),
            served_model_name: self.served_model_name.clone(),
            tokenizer: self.tokenizer.clone(),
            disable_tqdm: self.disable_tqdm,
            input_len: self.input_len.unwrap_or(self.random_input_len),
            output_len: self.output_len.unwrap_or(self.random_output_len),
            range_ratio: parse_range_ratio(&self.random_range_ratio)?,
            prefix_len: self.random_prefix_len,
            num_prompts: self.num_prompts,
            max_concurrency: self.max_concurrency,
            request_rate: self.request_rate,
            burstiness: self.burstiness,
            // vLLM: "when using random datasets, default to ignoring EOS so
            // generation runs to the requested length".
            ignore_eos: self.ignore_eos || self.dataset_name == "random",
            percentile_metrics,
            percentiles,
            seed: self.seed,
            num_warmups: self.num_warmups,
            save_result: self.save_result,
            save_detailed: self.save_detailed,
            result_dir: self.result_dir.clone(),
            result_filename: self.result_filename.clone(),
            label: self.label.clone(),
            request_id_prefix: self
                .request_id_prefix
                .clone()
                .unwrap_or_else(|| format!("bench-{}-", random_tag())),
            logprobs: self.logprobs,
            extra_body,
            disconnect_fraction: self.disconnect_fraction,
            check_kv_drain: self.check_kv_drain,
            server_pid: self.server_pid.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<Config> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))?;
        cli.bench.validate()
    }

    #[test]
    fn defaults_are_vllms() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.api_url, "http://127.0.0.1:8000/v1/completions");
        assert_eq!(
            (c.input_len, c.output_len, c.num_prompts),
            (1024, 128, 1000)
        );
        assert_eq!(c.request_rate, f64::INFINITY);
        assert_eq!(c.percentile_metrics, vec!["ttft", "tpot", "itl"]);
        assert_eq!(c.percentiles, vec![99.0]);
        assert!(c.ignore_eos, "the random dataset ignores EOS, as in vLLM");
        assert_eq!(c.max_concurrency, None);
        assert!(c.request_id_prefix.starts_with("bench-"));
    }

    #[test]
    fn old_names_are_aliases() {
        let c = parse(&[
            "--url",
            "http://h:1/",
            "--num-requests",
            "5",
            "--concurrency",
            "2",
            "--stream",
            "--backend",
            "openai-chat",
        ])
        .unwrap();
        assert_eq!(c.api_url, "http://h:1/v1/chat/completions");
        assert_eq!((c.num_prompts, c.max_concurrency), (5, Some(2)));
    }

    #[test]
    fn bad_values_name_their_flag() {
        let err = |a: &[&str]| format!("{:#}", parse(a).unwrap_err());
        assert!(
            err(&["--backend", "openai-chat", "--endpoint", "/v1/completions"])
                .contains("--endpoint")
        );
        assert!(err(&["--request-rate", "0"]).contains("--request-rate"));
        assert!(err(&["--burstiness=-1"]).contains("--burstiness"));
        assert!(err(&["--percentile-metrics", "ttft,nope"]).contains("--percentile-metrics"));
        assert!(err(&["--metric-percentiles", "101"]).contains("--metric-percentiles"));
        assert!(err(&["--random-range-ratio", "1.0"]).contains("--random-range-ratio"));
        assert!(err(&["--max-concurrency", "0"]).contains("--max-concurrency"));
        assert!(err(&["--base-url", "localhost:8000"]).contains("--base-url"));
    }

    #[test]
    fn range_ratio_forms() {
        assert_eq!(parse_range_ratio("0.25").unwrap(), (0.25, 0.25));
        assert_eq!(
            parse_range_ratio(r#"{"input": 0.3, "output": 0.5}"#).unwrap(),
            (0.3, 0.5)
        );
        assert!(parse_range_ratio(r#"{"input": 0.3}"#).is_err());
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        let c = parse(&["--host", "::1", "--port", "9"]).unwrap();
        assert_eq!(c.base_url, "http://[::1]:9");
        let c = parse(&["--request-rate", "inf", "--input-len", "7"]).unwrap();
        assert_eq!((c.request_rate, c.input_len), (f64::INFINITY, 7));
    }
}
