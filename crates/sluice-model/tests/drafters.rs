//! The n-gram proposer and the batch-size schedule against vLLM 0.33's own
//! functions: `tests/data/speculative_vllm.json` holds what vLLM's
//! `_find_longest_matched_ngram_and_propose_tokens` proposed for random
//! contexts, and what `build_dynamic_sd_schedule_lookup` /
//! `validate_and_normalize_dynamic_sd_schedule` made of schedules
//! (`tools/make_speculative_fixtures.py`).

use serde_json::Value;
use sluice_model::{DraftRequest, Drafter, NgramDrafter, SpeculativeConfig};

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/speculative_vllm.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("fixture JSON")
}

fn ints(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn ngram_proposals_equal_vllms() {
    let f = fixture();
    let cases = f["ngram"].as_array().unwrap();
    assert!(cases.len() >= 100);
    let mut nonempty = 0;
    for case in cases {
        let tokens: Vec<u32> = ints(&case["tokens"])
            .into_iter()
            .map(|t| t as u32)
            .collect();
        let want: Vec<u32> = ints(&case["proposal"])
            .into_iter()
            .map(|t| t as u32)
            .collect();
        let n = |k: &str| case[k].as_u64().unwrap() as usize;
        let mut d = NgramDrafter::new(n("min_n"), n("max_n")).unwrap();
        let id = "r".into();
        let req = DraftRequest {
            req_id: &id,
            token_ids: &tokens,
            num_prompt_tokens: tokens.len(),
            max_model_len: n("max_model_len"),
        };
        let mut got = Vec::new();
        d.propose(&req, n("k"), &mut got);
        assert_eq!(got, want, "case {case}");
        nonempty += usize::from(!want.is_empty());
    }
    // The fixture exercises real proposals, not only empty ones.
    assert!(nonempty > cases.len() / 4, "{nonempty} non-empty proposals");
}

#[test]
fn batch_size_schedules_equal_vllms() {
    let f = fixture();
    for case in f["schedules"].as_array().unwrap() {
        let k = case["k"].as_u64().unwrap();
        let json = format!(
            r#"{{"method": "ngram", "num_speculative_tokens": {k},
                 "num_speculative_tokens_per_batch_size": {}}}"#,
            case["schedule"]
        );
        let c = SpeculativeConfig::parse(&json).unwrap_or_else(|e| panic!("{json}: {e:#}"));
        let max = case["max_num_seqs"].as_u64().unwrap() as usize;
        let got: Vec<u64> = c.k_by_batch_size(max)[1..]
            .iter()
            .map(|&k| k as u64)
            .collect();
        let want = ints(&case["lookup"]);
        assert_eq!(got, want[1..], "schedule {}", case["schedule"]);
    }
    for case in f["schedule_errors"].as_array().unwrap() {
        let json = format!(
            r#"{{"method": "ngram", "num_speculative_tokens": 3,
                 "num_speculative_tokens_per_batch_size": {}}}"#,
            case["schedule"]
        );
        let e = format!("{:#}", SpeculativeConfig::parse(&json).unwrap_err());
        let want = case["error"].as_str().unwrap();
        assert!(e.contains(want), "{json}: {e:?} is not vLLM's {want:?}");
    }
}
