//! Seeded streams: the same seed draws the same tokens whatever the batch,
//! and a rebuilt sampler continues its stream.

use super::*;

#[test]
fn same_seed_same_stream_whatever_the_batch() {
    let params = SamplingParams {
        top_p: 0.9,
        top_k: 50,
        seed: Some(42),
        ..SamplingParams::default()
    };
    let logits: Vec<Vec<f32>> = (0..64)
        .map(|i| {
            (0..1000)
                .map(|j| (((i * 7 + j * 13) % 101) as f32) * 0.05)
                .collect()
        })
        .collect();
    let run = |others: usize, default_seed: u64| {
        let mut s = RequestSampler::new(Arc::new(params.clone()), &[1, 2, 3], default_seed);
        let mut noise: Vec<RequestSampler> = (0..others)
            .map(|o| RequestSampler::new(Arc::new(random(1.0)), &[], o as u64))
            .collect();
        let mut outputs = Vec::new();
        for row in &logits {
            // Other requests sample before ours in the same step.
            for n in &mut noise {
                n.sample(&mut row.clone(), &outputs);
            }
            let t = s.sample(&mut row.clone(), &outputs).token;
            outputs.push(t);
        }
        outputs
    };
    let alone = run(0, 1);
    assert_eq!(
        alone,
        run(5, 2),
        "batch composition or default seed changed a seeded stream"
    );
    let other_seed = {
        let mut p = params.clone();
        p.seed = Some(43);
        let mut s = RequestSampler::new(Arc::new(p), &[1, 2, 3], 1);
        let mut outputs = Vec::new();
        for row in &logits {
            let t = s.sample(&mut row.clone(), &outputs).token;
            outputs.push(t);
        }
        outputs
    };
    assert_ne!(alone, other_seed);
}

#[test]
fn unseeded_requests_use_the_default_seed() {
    let p = Arc::new(SamplingParams::default());
    let draw = |seed: u64| {
        let mut s = RequestSampler::new(p.clone(), &[], seed);
        histogram_stream(&mut s)
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

fn histogram_stream(s: &mut RequestSampler) -> Vec<u32> {
    let logits = [0.0f32; 64];
    let mut outputs = Vec::new();
    for _ in 0..32 {
        let t = s.sample(&mut logits.clone(), &outputs).token;
        outputs.push(t);
    }
    outputs
}

#[test]
fn rebuilt_sampler_continues_the_stream() {
    // A runner that drops and rebuilds the sampler (after a preemption)
    // gets the same tokens, because draw n depends on (seed, n) only.
    let p = Arc::new(random(1.0));
    let mut a = RequestSampler::new(p.clone(), &[], 0);
    let full = histogram_stream(&mut a);
    let mut b = RequestSampler::new(p, &[], 0);
    let logits = [0.0f32; 64];
    let t = b.sample(&mut logits.clone(), &full[..10]).token;
    assert_eq!(t, full[10]);
}
