//! sluice's block hashes against vLLM 0.33.0's own: every hash, external
//! hash and root (`NONE_HASH`) in `tests/data/vllm-block-hashes.json` was
//! computed by vLLM's `hash_block_tokens` / `init_none_hash` (the script
//! `tests/data/make_vllm_hashes.py` wrote it), for both SHA-256 encodings,
//! with and without `PYTHONHASHSEED`, salted and unsalted, token ids past
//! 2^31 and blocks past pickle's 64 KiB frame. The raw encodings of single
//! ints and strings are checked too.

use serde_json::Value;
use sluice_core::block_hash::{cbor, pickle, Buf};
use sluice_core::{BlockHasher, HashAlgo};
use std::path::Path;

fn data() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vllm-block-hashes.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("hash data")).expect("JSON")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn tokens(v: &Value) -> Vec<u32> {
    if let Some(list) = v.as_array() {
        return list.iter().map(|t| t.as_u64().unwrap() as u32).collect();
    }
    let offset = v["offset"].as_u64().unwrap();
    let count = v["count"].as_u64().unwrap();
    let m = v["modulus"].as_u64();
    (0..count)
        .map(|i| (offset + m.map_or(i, |m| i % m)) as u32)
        .collect()
}

#[test]
fn block_hashes_equal_vllms() {
    let d = data();
    let cases = d["cases"].as_array().unwrap();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for (i, c) in cases.iter().enumerate() {
        let algo: HashAlgo = c["algo"].as_str().unwrap().parse().unwrap();
        let digest_len = if c["algo"].as_str().unwrap().starts_with("sha") {
            32
        } else {
            16
        };
        let seed = c["seed"].as_str();
        let block_size = c["block_size"].as_u64().unwrap() as usize;
        let h = BlockHasher::new(algo, block_size, seed);
        let ctx = format!("case {i} ({algo}, seed {seed:?}, B = {block_size})");
        assert_eq!(
            hex(&h.none_hash().0[32 - digest_len..]),
            c["none_hash"].as_str().unwrap(),
            "{ctx}: NONE_HASH"
        );
        let mut got = Vec::new();
        h.extend(&tokens(&c["tokens"]), c["cache_salt"].as_str(), &mut got);
        let want: Vec<&str> = c["hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        let got_hex: Vec<String> = got.iter().map(|g| hex(&g.0[32 - digest_len..])).collect();
        assert_eq!(got_hex, want, "{ctx}");
        let ext: Vec<u64> = c["external"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let got_ext: Vec<u64> = got.iter().map(|g| g.external()).collect();
        assert_eq!(got_ext, ext, "{ctx}: external hashes");
    }
}

#[test]
fn single_value_encodings_equal_cpythons_and_cbor2s() {
    let d = data();
    for e in d["encodings"].as_array().unwrap() {
        let (mut p, mut c) = (Buf::new(), Buf::new());
        let mut pk = pickle::Pickler::new(&mut p);
        if let Some(s) = e["int"].as_str() {
            let v: i128 = s.parse().unwrap();
            pk.int(v);
            cbor::int(&mut c, v);
        } else {
            let s = e["str"].as_str().unwrap();
            pk.str(s);
            cbor::str(&mut c, s);
        }
        pk.boundary();
        pk.finish();
        assert_eq!(hex(&p), e["pickle"].as_str().unwrap(), "pickle of {e}");
        assert_eq!(hex(&c), e["cbor"].as_str().unwrap(), "cbor of {e}");
    }
}
