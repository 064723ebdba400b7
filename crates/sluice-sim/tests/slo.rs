//! SLOs and goodput: vLLM's `--goodput` arithmetic on hand-computed
//! timelines, attainment, and the `--slo` text form's errors.

use sluice_sim::slo::{RequestLatency, SloError, DEFAULT_ATTAINMENT};
use sluice_sim::{Goodput, RequestTimeline, Slo};

fn timeline(arrival_s: f64, token_times: &[f64]) -> RequestTimeline {
    RequestTimeline {
        id: format!("{arrival_s}"),
        arrival_s,
        prompt_len: 10,
        output_len: token_times.len(),
        token_times: token_times.to_vec(),
        finish_s: token_times.last().copied(),
        ..RequestTimeline::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn three_requests_one_late_first_token_one_slow_decode() {
    let slo: Slo = "ttft=100,tpot=20".parse().unwrap();
    let requests = [
        // TTFT 50 ms, E2EL 70 ms, TPOT (70 − 50) / 2 = 10 ms: good.
        timeline(0.0, &[0.05, 0.06, 0.07]),
        // TTFT 150 ms: fails TTFT (its TPOT of 10 ms would pass).
        timeline(0.1, &[0.25, 0.26]),
        // TTFT 50 ms, E2EL 200 ms, TPOT (200 − 50) / 3 = 50 ms: fails TPOT.
        timeline(0.2, &[0.25, 0.30, 0.35, 0.40]),
    ];
    let l = RequestLatency::of(&requests[2]).unwrap();
    assert!(close(l.ttft_s, 0.05) && close(l.e2el_s, 0.2) && close(l.tpot_s, 0.05));
    assert_eq!(
        requests.iter().map(|t| slo.is_good(t)).collect::<Vec<_>>(),
        [true, false, false]
    );
    let g = slo.goodput(&requests, 0.5);
    assert_eq!((g.good, g.total), (1, 3));
    assert!(close(g.request_goodput, 2.0));
    assert!(close(g.attainment(), 1.0 / 3.0));
    assert!(!slo.meets(&g));

    // Loosen TPOT: the third passes; TTFT still fails the second.
    let loose: Slo = "ttft=100,tpot=50.5".parse().unwrap();
    assert_eq!(loose.goodput(&requests, 0.5).good, 2);
    // Only an E2EL objective: 70, 160 and 200 ms against 180.
    let e2el: Slo = "e2el=180".parse().unwrap();
    assert_eq!(e2el.goodput(&requests, 0.5).good, 2);
}

#[test]
fn objectives_are_inclusive() {
    // 0.125 s is exact in binary, as is 125 / 1000 after rounding.
    let t = timeline(0.0, &[0.125, 0.25]);
    assert!("ttft=125,tpot=125".parse::<Slo>().unwrap().is_good(&t));
    assert!(!"ttft=124.9".parse::<Slo>().unwrap().is_good(&t));
}

#[test]
fn a_single_token_output_has_zero_tpot() {
    // vLLM counts TPOT as 0 for goodput when the output has one token.
    let t = timeline(0.0, &[0.09]);
    assert_eq!(RequestLatency::of(&t).unwrap().tpot_s, 0.0);
    assert!("ttft=100,tpot=0".parse::<Slo>().unwrap().is_good(&t));
}

#[test]
fn an_unfinished_request_is_never_good_but_counts() {
    let mut unfinished = timeline(0.0, &[0.01]);
    unfinished.finish_s = None;
    let never_started = RequestTimeline::default();
    let slo: Slo = "ttft=1000".parse().unwrap();
    let g = slo.goodput(&[timeline(0.0, &[0.01]), unfinished, never_started], 1.0);
    assert_eq!((g.good, g.total), (1, 3));
    assert!(RequestLatency::of(&RequestTimeline::default()).is_none());
}

#[test]
fn meets_asks_for_the_attainment_fraction() {
    let slo: Slo = "ttft=100".parse().unwrap();
    assert_eq!(slo.attainment, DEFAULT_ATTAINMENT);
    let at = |good: usize, total: usize| Goodput {
        good,
        total,
        request_goodput: 0.0,
    };
    assert!(slo.meets(&at(9, 10)));
    assert!(!slo.meets(&at(8, 10)));
    assert!(!slo.meets(&at(0, 0)));
    let strict: Slo = "ttft=100,attainment=1".parse().unwrap();
    assert!(!strict.meets(&at(99, 100)));
    assert!(strict.meets(&at(100, 100)));
}

#[test]
fn zero_duration_gives_zero_goodput() {
    let slo: Slo = "ttft=100".parse().unwrap();
    let g = slo.goodput(&[timeline(0.0, &[0.0])], 0.0);
    assert_eq!((g.good, g.request_goodput), (1, 0.0));
}

#[test]
fn the_text_form_parses_and_prints_back() {
    let slo: Slo = " ttft=500, tpot:50 ,e2el=20000,attainment=0.95"
        .parse()
        .unwrap();
    assert_eq!(
        slo,
        Slo {
            ttft_ms: Some(500.0),
            tpot_ms: Some(50.0),
            e2el_ms: Some(20000.0),
            attainment: 0.95,
        }
    );
    assert_eq!(
        slo.to_string(),
        "ttft=500,tpot=50,e2el=20000,attainment=0.95"
    );
    assert_eq!(slo.to_string().parse::<Slo>().unwrap(), slo);
    let tpot_only: Slo = "tpot=12.5".parse().unwrap();
    assert_eq!((tpot_only.ttft_ms, tpot_only.tpot_ms), (None, Some(12.5)));
    assert_eq!(tpot_only.to_string(), "tpot=12.5,attainment=0.9");
}

#[test]
fn parse_errors_name_the_bad_key_or_value() {
    let err = |s: &str| s.parse::<Slo>().unwrap_err();
    assert_eq!(err(""), SloError::Empty);
    assert_eq!(err("ttft"), SloError::NotAPair("ttft".into()));
    assert_eq!(err("ttft=100,"), SloError::NotAPair("".into()));
    assert_eq!(err("itl=5"), SloError::UnknownKey("itl".into()));
    assert_eq!(err("ttft=1,ttft=2"), SloError::Duplicate("ttft".into()));
    for bad in ["abc", "-1", "inf", "NaN", ""] {
        assert_eq!(
            err(&format!("ttft=100,tpot={bad}")),
            SloError::BadMillis {
                key: "tpot".into(),
                value: bad.into()
            }
        );
    }
    for bad in ["0", "1.5", "x", "-0.2"] {
        assert_eq!(
            err(&format!("ttft=1,attainment={bad}")),
            SloError::BadAttainment(bad.into())
        );
    }
    assert_eq!(err("attainment=0.9"), SloError::NoObjective);
    let message = err("ttft=100,tpot=fast").to_string();
    assert!(
        message.contains("`tpot`") && message.contains("`fast`"),
        "{message}"
    );
    let message = err("itl=5").to_string();
    assert!(
        message.contains("`itl`") && message.contains("ttft, tpot, e2el"),
        "{message}"
    );
}
