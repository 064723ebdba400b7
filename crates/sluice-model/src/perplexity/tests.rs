use super::*;
use crate::model::Model;

fn tiny() -> Model {
    let (config, generation) = crate::builtin::config("tiny").unwrap();
    let loaded = crate::model::load_dummy(config, generation, crate::DType::F32, 7).unwrap();
    Model::build(&loaded).unwrap()
}

fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((i * 2_654_435_761 + 17) % vocab as u64) as u32)
        .collect()
}

/// The logits at the last position of `prefix`, from a fresh cache and
/// one forward pass of the whole prefix: the brute force the windows are
/// checked against.
fn last_logits(model: &Model, prefix: &[u32]) -> Vec<f32> {
    let bs = 16;
    let blocks = prefix.len().div_ceil(bs);
    let mut kv = KvCache::new(&model.config, KvCacheConfig::new(bs, blocks + 1)).unwrap();
    let table: Vec<u32> = (1..=blocks as u32).rev().collect();
    let mut batch = ForwardBatch::default();
    batch.push_seq(prefix, 0, &table, bs).unwrap();
    batch.logits_rows.push(prefix.len() - 1);
    model.forward(&batch, &mut kv).unwrap()
}

/// Every scored row of a window against the prefix's own forward pass,
/// whatever the forward passes are cut into, with BOS put in front; and
/// the perplexity against log-softmax in f64 over those brute-force rows.
#[test]
fn windows_score_the_second_half_as_brute_force_prefixes_do() {
    let model = tiny();
    let vocab = model.config.vocab_size;
    let n_ctx = 24;
    let toks = tokens(3 * n_ctx + 5, vocab);
    let n_chunk = num_chunks(toks.len(), n_ctx, None).unwrap();
    assert_eq!(n_chunk, 3);
    let bos = Some(1);

    let mut want_nll = 0f64;
    let mut count = 0;
    let mut rows_by_batch = Vec::new();
    for n_batch in [n_ctx, 5] {
        let mut eval = Evaluator::new(&model, n_ctx, n_batch, bos, KvDtype::F32).unwrap();
        let mut all = Vec::new();
        for i in 0..n_chunk {
            let window = &toks[i * n_ctx..(i + 1) * n_ctx];
            all.extend_from_slice(eval.window_logits(window).unwrap());
        }
        rows_by_batch.push(all);
    }
    assert_eq!(
        rows_by_batch[0], rows_by_batch[1],
        "cut into passes of 5 tokens"
    );
    let rows = &rows_by_batch[0];
    assert_eq!(rows.len(), n_chunk * scored_per_window(n_ctx) * vocab);
    let mut r = 0;
    for i in 0..n_chunk {
        let mut window = toks[i * n_ctx..(i + 1) * n_ctx].to_vec();
        window[0] = 1;
        for p in first_scored(n_ctx)..n_ctx - 1 {
            let want = last_logits(&model, &window[..=p]);
            let got = &rows[r * vocab..(r + 1) * vocab];
            let worst = want
                .iter()
                .zip(got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "chunk {i} position {p}: {worst}");
            let max = want.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64));
            let z: f64 = want.iter().map(|&l| (l as f64 - max).exp()).sum();
            want_nll -= want[window[p + 1] as usize] as f64 - max - z.ln();
            count += 1;
            r += 1;
        }
    }
    let mut eval = Evaluator::new(&model, n_ctx, 512, bos, KvDtype::F32).unwrap();
    let mut seen = Vec::new();
    let sums = perplexity(&mut eval, &toks, n_chunk, None, |i, s| {
        seen.push((i, s.count))
    })
    .unwrap();
    assert_eq!(seen, [(0, 11), (1, 22), (2, 33)]);
    assert_eq!(sums.count, count);
    let want_ppl = (want_nll / count as f64).exp();
    assert!(
        (sums.ppl() / want_ppl - 1.0).abs() < 1e-5,
        "{} vs {want_ppl}",
        sums.ppl()
    );
}

/// A base saved by `perplexity` and read back by `kl_divergence` with the
/// same model: zero divergence (up to the 16-bit codes), every top token
/// the same, the base's perplexity equal to the model's; a KV cache in
/// q8_0 diverges, a little.
#[test]
fn a_saved_base_compares_with_its_own_model_and_a_rounded_cache() {
    let model = tiny();
    let n_ctx = 32;
    let toks = tokens(4 * n_ctx, model.config.vocab_size);
    let mut file = Vec::new();
    let mut eval = Evaluator::new(&model, n_ctx, 512, None, KvDtype::F32).unwrap();
    let base_sums = perplexity(&mut eval, &toks, 4, Some(&mut file), |_, _| {}).unwrap();
    let mut r = &file[..];
    let header = BaseHeader::read(&mut r).unwrap();
    assert_eq!((header.n_ctx, header.n_chunk), (n_ctx, 4));
    assert_eq!(header.tokens, toks);
    let run = kl_divergence(&mut eval, &header, &mut { r }, None, |_, _| {}).unwrap();
    assert_eq!(run.sums.count, base_sums.count);
    assert_eq!(run.sums.n_same_top, run.sums.count);
    let mean_kld = run.sums.sum_kld / run.sums.count as f64;
    assert!(mean_kld.abs() < 1e-5, "{mean_kld}");
    let ppl = (run.sums.sum_nll / run.sums.count as f64).exp();
    let ppl_base = (run.sums.sum_nll_base / run.sums.count as f64).exp();
    assert!((ppl / base_sums.ppl() - 1.0).abs() < 1e-5);
    assert!((ppl_base / ppl - 1.0).abs() < 1e-3, "{ppl_base} vs {ppl}");
    assert!(run.kld.windows(2).all(|w| w[0] <= w[1]));

    let mut q8 = Evaluator::new(&model, n_ctx, 512, None, KvDtype::Q8_0).unwrap();
    let rounded = kl_divergence(&mut q8, &header, &mut { r }, Some(2), |_, _| {}).unwrap();
    assert_eq!(rounded.sums.count, 2 * scored_per_window(n_ctx));
    let mean = rounded.sums.sum_kld / rounded.sums.count as f64;
    assert!(mean > mean_kld && mean < 0.05, "{mean}");

    // A base of another context or vocabulary is refused, naming both.
    let mut other = Evaluator::new(&model, 16, 512, None, KvDtype::F32).unwrap();
    let e = kl_divergence(&mut other, &header, &mut { r }, None, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("context of 32"), "{e}");
}

#[test]
fn too_short_a_text_is_refused() {
    let e = num_chunks(100, 64, None).unwrap_err();
    assert!(e.to_string().contains("100 tokens; at least 128"), "{e}");
    assert_eq!(num_chunks(1000, 64, Some(3)).unwrap(), 3);
    assert!(num_chunks(1000, 2, None).is_err());
}
