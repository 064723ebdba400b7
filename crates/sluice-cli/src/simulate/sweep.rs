//! Rate and replica sweeps: one row per run, and the answer against
//! `--slo` (the highest rate, or the fewest replicas, that meets it).

use super::*;

/// One row of a sweep.
pub(super) fn sweep_row(
    args: &RunArgs,
    result: &SimResult,
    rate: f64,
    replicas: usize,
) -> (Value, bool) {
    let r = SimReport::from_result(result);
    let (goodput, attainment, meets) = match &args.slo {
        Some(slo) => {
            let g = slo.goodput_of(result);
            (g.request_goodput, g.attainment(), slo.meets(&g))
        }
        None => (r.request_throughput, 1.0, true),
    };
    let v = json!({
        "request_rate": json_rate(rate),
        "replicas": replicas,
        "request_throughput": r.request_throughput,
        "output_throughput": r.output_throughput,
        "median_ttft_ms": r.ttft.median_ms,
        "p99_ttft_ms": r.ttft.p99_ms,
        "median_tpot_ms": r.tpot.median_ms,
        "p99_tpot_ms": r.tpot.p99_ms,
        "request_goodput": goodput,
        "slo_attainment": attainment,
        "meets_slo": meets,
        "num_preemptions": r.num_preemptions,
    });
    (v, meets)
}

pub(super) fn print_sweep_header(first: &str) {
    println!(
        "{first:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>7}",
        "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "goodput", "meets"
    );
}

pub(super) fn print_sweep_row(first: String, v: &Value) {
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    println!(
        "{first:>8} {:>9.2} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>9.2} {:>7}",
        f("request_throughput"),
        f("output_throughput"),
        f("median_ttft_ms"),
        f("p99_ttft_ms"),
        f("median_tpot_ms"),
        f("p99_tpot_ms"),
        f("request_goodput"),
        if v["meets_slo"].as_bool().unwrap_or(false) {
            "yes"
        } else {
            "no"
        }
    );
}

pub(super) fn sweep_rates(args: &RunArgs, setup: &Setup, rates: &[f64]) -> Result<()> {
    let mut rows = Vec::new();
    let mut best: Option<f64> = None;
    if !args.json {
        print_sweep_header("rate");
    }
    for &rate in rates {
        let requests = workload(args, setup, rate)?;
        let result = simulate(args, setup, &requests, args.replicas, None)?;
        warn_beyond_fit(setup, &result);
        let (row, meets) = sweep_row(args, &result, rate, result.replicas.len());
        if !args.json {
            print_sweep_row(format!("{rate}"), &row);
        }
        if meets {
            best = Some(rate);
        }
        rows.push(row);
    }
    finish_sweep(
        args,
        rows,
        "max_request_rate_meeting_slo",
        best.map(|b| json!(b)),
    )
}

pub(super) fn sweep_replicas(args: &RunArgs, setup: &Setup, lo: usize, hi: usize) -> Result<()> {
    let requests = workload(args, setup, args.request_rate)?;
    let mut rows = Vec::new();
    let mut fewest: Option<usize> = None;
    if !args.json {
        print_sweep_header("replicas");
    }
    for n in lo..=hi {
        let result = simulate(args, setup, &requests, n, None)?;
        warn_beyond_fit(setup, &result);
        let (row, meets) = sweep_row(args, &result, args.request_rate, n);
        if !args.json {
            print_sweep_row(format!("{n}"), &row);
        }
        rows.push(row);
        if meets {
            fewest = Some(n);
            break;
        }
    }
    finish_sweep(
        args,
        rows,
        "min_replicas_meeting_slo",
        fewest.map(|n| json!(n)),
    )
}

pub(super) fn finish_sweep(
    args: &RunArgs,
    rows: Vec<Value>,
    key: &str,
    answer: Option<Value>,
) -> Result<()> {
    if args.json {
        let v =
            json!({ "rows": rows, key: answer, "slo": args.slo.as_ref().map(|s| s.to_string()) });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match (&args.slo, answer) {
        (None, _) => println!("(give --slo ttft=MS,tpot=MS to find the {key})"),
        (Some(slo), Some(a)) => println!("{key}: {a} (SLO {slo})"),
        (Some(slo), None) => println!("{key}: none in the range meets the SLO {slo}"),
    }
    Ok(())
}
