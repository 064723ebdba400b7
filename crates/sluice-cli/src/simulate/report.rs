//! What a run reports: vLLM's summary block, the `--save-result` JSON, the
//! step timeline CSV, and the note on steps beyond a fitted profile.

use super::*;

/// One run's report as JSON: vLLM's `--save-result` keys, sluice's extras,
/// goodput under the SLO, per-replica figures.
pub(super) fn report_json(
    args: &RunArgs,
    result: &SimResult,
    slo: Option<&Slo>,
    rate: f64,
) -> Value {
    let report = SimReport::from_result(result);
    let mut m: Map<String, Value> = match report.to_json() {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    m.insert("request_rate".into(), json_rate(rate));
    m.insert("burstiness".into(), json!(args.burstiness));
    m.insert("max_concurrency".into(), json!(args.max_concurrency));
    m.insert("num_prompts".into(), json!(result.requests.len()));
    m.insert("replicas".into(), json!(result.replicas.len()));
    if let Some(slo) = slo {
        let g = slo.goodput_of(result);
        m.insert("request_goodput".into(), json!(g.request_goodput));
        m.insert("slo".into(), json!(slo.to_string()));
        m.insert("slo_attainment".into(), json!(g.attainment()));
        m.insert("meets_slo".into(), json!(slo.meets(&g)));
    }
    if args.per_replica || result.replicas.len() > 1 {
        let per: Vec<Value> = (0..result.replicas.len())
            .map(|k| {
                let mut v = SimReport::for_replica(result, k).to_json();
                if let Value::Object(o) = &mut v {
                    o.insert("replica".into(), json!(k));
                    o.insert("role".into(), json!(replica_role(result, k)));
                }
                v
            })
            .collect();
        m.insert("per_replica".into(), Value::Array(per));
    }
    Value::Object(m)
}

/// What replica `k` does: prefill or decode under P/D, else both.
pub(super) fn replica_role(result: &SimResult, k: usize) -> &'static str {
    if k < result.num_prefill_replicas {
        "prefill"
    } else if result.num_prefill_replicas > 0 {
        "decode"
    } else {
        "both"
    }
}

pub(super) fn json_rate(rate: f64) -> Value {
    if rate.is_finite() {
        json!(rate)
    } else {
        json!("inf")
    }
}

/// vLLM's summary block, with the simulator's extras.
pub(super) fn print_summary(args: &RunArgs, setup: &Setup, result: &SimResult, slo: Option<&Slo>) {
    let r = SimReport::from_result(result);
    let line = |k: &str, v: String| println!("{k:<40}{v:>12}");
    println!("{:=^52}", " Simulated Serving Benchmark Result ");
    line("Successful requests:", r.completed.to_string());
    if let Some(c) = args.max_concurrency {
        line("Maximum request concurrency:", c.to_string());
    }
    line("Benchmark duration (s):", format!("{:.2}", r.duration_s));
    line("Total input tokens:", r.total_input_tokens.to_string());
    line("Total generated tokens:", r.total_output_tokens.to_string());
    line(
        "Request throughput (req/s):",
        format!("{:.2}", r.request_throughput),
    );
    if let Some(slo) = slo {
        let g = slo.goodput_of(result);
        line(
            "Request goodput (req/s):",
            format!("{:.2}", g.request_goodput),
        );
        line("SLO attainment:", format!("{:.1}%", 100.0 * g.attainment()));
    }
    line(
        "Output token throughput (tok/s):",
        format!("{:.2}", r.output_throughput),
    );
    line(
        "Total Token throughput (tok/s):",
        format!("{:.2}", r.total_token_throughput),
    );
    for (title, name, s) in [
        ("Time to First Token", "TTFT", &r.ttft),
        ("Time per Output Token (excl. 1st token)", "TPOT", &r.tpot),
        ("Inter-token Latency", "ITL", &r.itl),
        ("End-to-end Latency", "E2EL", &r.e2el),
    ] {
        println!("{:-^52}", title);
        line(&format!("Mean {name} (ms):"), format!("{:.2}", s.mean_ms));
        line(
            &format!("Median {name} (ms):"),
            format!("{:.2}", s.median_ms),
        );
        line(&format!("P90 {name} (ms):"), format!("{:.2}", s.p90_ms));
        line(&format!("P99 {name} (ms):"), format!("{:.2}", s.p99_ms));
    }
    println!("{:-^52}", "Engine");
    line("Preemptions:", r.num_preemptions.to_string());
    line(
        "Prefix cache hit rate:",
        format!("{:.1}%", 100.0 * r.prefix_cache_hit_rate),
    );
    line(
        "KV cache usage mean / peak:",
        format!(
            "{:.1}% / {:.1}%",
            100.0 * r.mean_kv_cache_usage,
            100.0 * r.peak_kv_cache_usage
        ),
    );
    line(
        "Batch size mean / peak:",
        format!("{:.1} / {}", r.mean_batch_size, r.peak_batch_size),
    );
    line("Simulated steps:", r.num_steps.to_string());
    println!("{}", "=".repeat(52));
    println!("({})", setup.kv_note);
    if args.per_replica || result.replicas.len() > 1 {
        println!(
            "{:>7} {:>8} {:>9} {:>10} {:>10} {:>9} {:>8} {:>8}",
            "replica",
            "role",
            "requests",
            "TTFT p50",
            "TPOT p50",
            "out tok/s",
            "KV peak",
            "preempt"
        );
        for k in 0..result.replicas.len() {
            let p = SimReport::for_replica(result, k);
            let role = replica_role(result, k);
            println!(
                "{:>7} {:>8} {:>9} {:>10.2} {:>10.2} {:>9.1} {:>7.1}% {:>8}",
                k,
                role,
                p.completed,
                p.ttft.median_ms,
                p.tpot.median_ms,
                p.output_throughput,
                100.0 * p.peak_kv_cache_usage,
                p.num_preemptions
            );
        }
    }
}

/// Says how many steps were larger than any the fitted profile saw, or
/// outside a measured table's grid.
pub(super) fn warn_beyond_fit(setup: &Setup, result: &SimResult) {
    let outside = result.steps.iter().filter(|s| s.outside_profile).count();
    if outside > 0 {
        eprintln!(
            "sluice simulate: {outside} of {} steps ({:.1}%) were outside the profile's measured \
             grid: their times are extrapolated (linearly from the last two grid points, held \
             below the first)",
            result.steps.len(),
            100.0 * outside as f64 / result.steps.len().max(1) as f64,
        );
    }
    let Some(range) = setup.fitted_range else {
        return;
    };
    let beyond = result
        .steps
        .iter()
        .filter(|s| range.exceeded_by(s.num_tokens, s.num_reqs))
        .count();
    if beyond > 0 {
        eprintln!(
            "sluice simulate: {beyond} of {} steps ({:.1}%) were larger than any the profile was \
             fitted on (at most {} tokens, {} requests a step): their times are extrapolated",
            result.steps.len(),
            100.0 * beyond as f64 / result.steps.len().max(1) as f64,
            range.max_tokens,
            range.max_rows
        );
    }
}

pub(super) fn write_timeline(path: &PathBuf, result: &SimResult) -> Result<()> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("--timeline: creating {}", path.display()))
        .map_err(crate::exit::config_error)?;
    let mut w = TimelineWriter::new(std::io::BufWriter::new(file))
        .with_context(|| format!("writing {}", path.display()))?;
    // Steps are listed as they started, which is time order.
    for s in &result.steps {
        w.write_step(s)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    w.finish()
        .and_then(|mut b| std::io::Write::flush(&mut b))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
