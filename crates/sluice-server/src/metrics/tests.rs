//! The float spellings against prometheus_client's and Python's, and the
//! families' text against vLLM's exposition.

use super::*;
use sluice_engine::Histogram;

#[test]
fn floats_render_as_prometheus_client_renders_them() {
    for (v, want) in [
        (1.0, "1.0"),
        (0.3, "0.3"),
        (0.001, "0.001"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (2560.0, "2560.0"),
        (16384.0, "16384.0"),
        (100000.0, "100000.0"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (2e7, "2e+07"),
        (1.796115002389645e9, "1.796115002389645e+09"),
        (4.217421824e9, "4.217421824e+09"),
        (1e16, "1e+16"),
        (1e22, "1e+22"),
        (0.0, "0.0"),
        (0.1 + 0.2, "0.30000000000000004"),
        (0.11777777777777779, "0.11777777777777779"),
        (-2.5, "-2.5"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
    ] {
        assert_eq!(go_float(v), want, "{v:e}");
    }
    assert_eq!(python_float_repr(31.9375), "31.9375");
    assert_eq!(python_float_repr(1e16), "1e+16");
    assert_eq!(python_float_repr(1e15), "1000000000000000.0");
    assert_eq!(python_float_repr(1e-5), "1e-05");
    assert_eq!(python_float_repr(1.5e-7), "1.5e-07");
}

fn stats() -> EngineStats {
    let c = SchedulerConfig::default();
    let mut s = sluice_engine::stats::StatsCollector::new(512, c.max_model_len).snapshot();
    s.started_unix_secs = 1.7e9;
    s.time_to_first_token = Histogram::new(&[0.1, 1.0]);
    s.time_to_first_token.observe(0.05);
    s.time_to_first_token.observe(0.5);
    s.time_to_first_token.observe(5.0);
    s
}

#[test]
fn histogram_buckets_are_cumulative_sorted_and_end_with_inf() {
    let text = render_text(&stats());
    for line in [
        "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"m\"} 1.0",
        "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 2.0",
        "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 3.0",
        "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 3.0",
        "vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"m\"} 5.55",
        "vllm:time_to_first_token_seconds_created{engine=\"0\",model_name=\"m\"} 1.7e+09",
        "# TYPE vllm:time_to_first_token_seconds_created gauge",
        "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"2000.0\",model_name=\"m\"} 0.0",
        "# TYPE vllm:num_requests_running gauge",
        "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 0.0",
        "vllm:request_success_total{engine=\"0\",finished_reason=\"repetition\",model_name=\"m\"} 0.0",
        "vllm:admission_rejections_total{model_name=\"m\",reason=\"max_num_queued_tokens\"} 0.0",
        "vllm:engine_sleep_state{engine=\"0\",model_name=\"m\",sleep_state=\"awake\"} 1.0",
        "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"16384.0\",model_name=\"m\"} 0.0",
        "# TYPE vllm:iteration_tokens_total histogram",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}

fn render_text(s: &EngineStats) -> String {
    let mut w = Exposition::new();
    render_engine(&mut w, s, &SchedulerConfig::default(), "m");
    w.finish()
}

#[test]
fn cache_config_info_has_vllms_38_keys_sorted_with_sluices_values() {
    let c = SchedulerConfig {
        num_gpu_blocks: 512,
        max_model_len: 256,
        block_size: 16,
        ..SchedulerConfig::default()
    };
    let labels = cache_config_labels(&c);
    assert_eq!(labels.len(), 38);
    assert!(labels.windows(2).all(|w| w[0].0 < w[1].0));
    let get = |k: &str| {
        labels
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("block_size"), Some("16"));
    assert_eq!(get("num_gpu_blocks"), Some("512"));
    assert_eq!(get("enable_prefix_caching"), Some("True"));
    assert_eq!(get("prefix_caching_hash_algo"), Some("sha256"));
    assert_eq!(get("kv_cache_max_concurrency"), Some("32.0"));
    assert_eq!(get("kv_cache_size_tokens"), Some("8192"));
    assert_eq!(get("kv_cache_dtype_skip_layers"), Some("[]"));
    assert_eq!(get("engine"), Some("0"));
}

#[test]
fn cache_config_info_of_a_hybrid_model_counts_what_its_groups_hold() {
    use sluice_core::kv_cache::KvCacheGroupSpec;
    // Gemma 3 270M's groups (five sliding over 512 tokens, one full) in a
    // pool of 985,999 blocks of 16. vLLM's `get_kv_cache_capacity`: a
    // 32768-token request holds 32768 ÷ 16 = 2048 full blocks and, per
    // sliding group, ⌈min(511 + 8192, 32768) ÷ 16⌉ + 1 = 545: 2048 + 5 ×
    // 545 = 4773 blocks; 985,999 ÷ 4773 = 206.57846218311334 requests,
    // int(× 32768) = 6,769,163 tokens. num_gpu_blocks is the shared pool's.
    let sliding = KvCacheGroupSpec::sliding_window(512);
    let c = SchedulerConfig {
        num_gpu_blocks: 985_999,
        max_model_len: 32_768,
        max_num_batched_tokens: 8192,
        block_size: 16,
        kv_cache_groups: [vec![sliding; 5], vec![KvCacheGroupSpec::FULL]].concat(),
        ..SchedulerConfig::default()
    };
    let labels = cache_config_labels(&c);
    let get = |labels: &[(&str, String)], k: &str| {
        labels
            .iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    assert_eq!(get(&labels, "num_gpu_blocks"), "985999");
    assert_eq!(get(&labels, "block_size"), "16");
    assert_eq!(
        get(&labels, "kv_cache_max_concurrency"),
        "206.57846218311334"
    );
    assert_eq!(get(&labels, "kv_cache_size_tokens"), "6769163");
    // vLLM fills `sliding_window` in only when every layer slides, and
    // the effective block size from the full-attention groups.
    assert_eq!(get(&labels, "sliding_window"), "None");
    assert_eq!(get(&labels, "effective_attention_block_size"), "16");
    // Every layer sliding over 4096 (Mistral): one group holding
    // ⌈min(4095 + 8192, 32768) ÷ 16⌉ + 1 = 769 blocks a request; 1000
    // blocks hold 1.3003901170351104 requests, 42,611 tokens.
    let mistral = SchedulerConfig {
        num_gpu_blocks: 1000,
        kv_cache_groups: vec![KvCacheGroupSpec::sliding_window(4096)],
        ..c
    };
    let labels = cache_config_labels(&mistral);
    assert_eq!(get(&labels, "sliding_window"), "4096");
    assert_eq!(get(&labels, "effective_attention_block_size"), "None");
    assert_eq!(
        get(&labels, "kv_cache_max_concurrency"),
        "1.3003901170351104"
    );
    assert_eq!(get(&labels, "kv_cache_size_tokens"), "42611");
}

#[test]
fn lora_requests_info_is_vllms_with_no_adapters() {
    let mut w = Exposition::new();
    lora_requests_info(&mut w);
    let text = w.finish();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("# HELP vllm:lora_requests_info Running stats on lora requests.")
    );
    assert_eq!(lines.next(), Some("# TYPE vllm:lora_requests_info gauge"));
    let sample = lines.next().unwrap_or_default();
    let value = sample
        .strip_prefix(
            "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} ",
        )
        .unwrap_or_else(|| panic!("{sample}"));
    // A unix timestamp, as set_to_current_time writes it.
    let t: f64 = value.parse().unwrap();
    assert!(t > 1.7e9, "{t}");
    assert_eq!(lines.next(), None);
}

#[test]
fn label_values_are_escaped() {
    let mut w = Exposition::new();
    w.sample("x", &[("b", "a\"b\\c\nd"), ("a", "1")], 2.0);
    assert_eq!(w.finish(), "x{a=\"1\",b=\"a\\\"b\\\\c\\nd\"} 2.0\n");
}

#[cfg(target_os = "linux")]
#[test]
fn process_families_come_from_proc() {
    let mut w = Exposition::new();
    process::render(&mut w);
    let text = w.finish();
    for family in [
        "process_virtual_memory_bytes gauge",
        "process_resident_memory_bytes gauge",
        "process_start_time_seconds gauge",
        "process_cpu_seconds_total counter",
        "process_open_fds gauge",
        "process_max_fds gauge",
    ] {
        assert!(text.contains(&format!("# TYPE {family}\n")), "{text}");
    }
    let start: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_start_time_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        start > now - 86400.0 * 365.0 && start <= now + 1.0,
        "{start}"
    );
}
