//! When each request is sent: vLLM's `get_request` schedule. With an
//! infinite `--request-rate` all at once; otherwise gamma-distributed gaps
//! (shape `--burstiness`, mean `1 / rate`; shape 1 is a Poisson process)
//! drawn from `np.random.seed(seed)`'s legacy stream, summed, then scaled
//! so that the last request goes out at exactly `n / rate` seconds (vLLM
//! does this so that throughput does not drift with the seed).

use super::rng::RandomState;

/// Send times in seconds after the benchmark's start, one per request.
pub fn send_times(n: usize, request_rate: f64, burstiness: f64, seed: u32) -> Vec<f64> {
    if request_rate.is_infinite() {
        return vec![0.0; n];
    }
    let mut rng = RandomState::new(seed);
    let mut t = 0.0;
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            t += if burstiness.is_infinite() {
                1.0 / request_rate
            } else {
                rng.gamma(burstiness, 1.0 / (request_rate * burstiness))
            };
            t
        })
        .collect();
    if let Some(&last) = times.last() {
        if last != 0.0 {
            let factor = (n as f64 / request_rate) / last;
            for x in &mut times {
                *x *= factor;
            }
        }
    }
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gaps(times: &[f64]) -> Vec<f64> {
        let mut prev = 0.0;
        times
            .iter()
            .map(|&t| {
                let g = t - prev;
                prev = t;
                g
            })
            .collect()
    }

    fn mean_and_cv(g: &[f64]) -> (f64, f64) {
        let m = g.iter().sum::<f64>() / g.len() as f64;
        let var = g.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / g.len() as f64;
        (m, var.sqrt() / m)
    }

    #[test]
    fn infinite_rate_sends_everything_at_once() {
        assert_eq!(send_times(3, f64::INFINITY, 1.0, 0), vec![0.0; 3]);
    }

    #[test]
    fn poisson_gaps_have_the_right_mean_and_are_deterministic() {
        let a = send_times(20_000, 4.0, 1.0, 0);
        assert_eq!(a, send_times(20_000, 4.0, 1.0, 0));
        assert_ne!(a, send_times(20_000, 4.0, 1.0, 1));
        // Scaled so the last send is at n / rate exactly.
        assert!((a[a.len() - 1] - 5000.0).abs() < 1e-6);
        let (m, cv) = mean_and_cv(&gaps(&a));
        assert!((m - 0.25).abs() < 1e-9, "mean gap {m}");
        // Exponential gaps: coefficient of variation 1.
        assert!((cv - 1.0).abs() < 0.03, "cv {cv}");
    }

    #[test]
    fn gamma_burstiness_sets_the_spread() {
        for (b, want_cv) in [(0.25, 2.0), (4.0, 0.5)] {
            let t = send_times(20_000, 10.0, b, 42);
            assert_eq!(t, send_times(20_000, 10.0, b, 42));
            let (m, cv) = mean_and_cv(&gaps(&t));
            assert!((m - 0.1).abs() < 1e-9, "mean gap {m}");
            // Gamma(shape b): cv = 1 / sqrt(b).
            assert!(
                (cv - want_cv).abs() < want_cv * 0.05,
                "burstiness {b}: cv {cv}"
            );
        }
    }

    #[test]
    fn matches_numpy_for_seed_0() {
        // np.random.seed(0); d = np.cumsum([np.random.gamma(1.0, 1/2) for
        // _ in range(4)]); d * (4 / 2) / d[-1]
        let want = FIXTURE;
        let got = send_times(4, 2.0, 1.0, 0);
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    const FIXTURE: [f64; 4] = [
        0.42308662643449835,
        1.0907390064119973,
        1.581524126676757,
        1.9999999999999998,
    ];

    #[test]
    fn infinite_burstiness_is_evenly_spaced() {
        let t = send_times(4, 2.0, f64::INFINITY, 0);
        assert_eq!(t, vec![0.5, 1.0, 1.5, 2.0]);
    }
}
