//! Timestamps and trace lines, against values computed by hand.

use super::*;

#[test]
fn timestamps_by_hand() {
    assert_eq!(parse_timestamp("1970-01-01 00:00:00").unwrap(), 0);
    assert_eq!(
        parse_timestamp("1970-01-02 00:00:01.5").unwrap(),
        86_401_500_000_000
    );
    // 2023-11-16 is day 19677 since the epoch.
    let t = parse_timestamp("2023-11-16 18:15:46.6805900").unwrap();
    assert_eq!(
        t,
        (19_677i128 * 86_400 + 18 * 3600 + 15 * 60 + 46) * 1_000_000_000 + 680_590_000
    );
    assert_eq!(
        parse_timestamp("2023-11-16T20:15:46.6805900+02:00").unwrap(),
        t
    );
    assert_eq!(
        parse_timestamp("2024-02-29 00:00:00Z").unwrap() % 1_000_000_000,
        0
    );
    for (bad, why) in [
        ("2023-11-16", "no time"),
        ("2023-13-01 00:00:00", "month 13"),
        ("2023-02-29 00:00:00", "day 29 of month 2"),
        ("2023-11-16 24:00:00", "time 24:00:00"),
        ("2023-11-16 18:15:46.1234567890", "10 fractional digits"),
        ("2023-11-16 18:15", "HH:MM:SS"),
        ("2023-11-16 18:15:4x", "`4x` is not a number"),
        ("23-11-16 18:15:46", "YYYY-MM-DD"),
    ] {
        let e = parse_timestamp(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn replay_output_len_follows_the_stop_rule() {
    let r = TraceRequest {
        id: "a".into(),
        arrival_step: 0,
        priority: 0,
        prompt: vec![1, 2, 3],
        output: vec![10, 11, 2, 12, 13, 14],
        max_tokens: 6,
        min_tokens: 4,
        eos_token_id: Some(2),
        ignore_eos: false,
        stop_token_ids: vec![13],
        drafts: Vec::new(),
    };
    // EOS at output[2]; min_tokens is not the scheduler's.
    assert_eq!(replay_output_len(&r, 100), 3);
    let ign = TraceRequest {
        ignore_eos: true,
        ..r.clone()
    };
    assert_eq!(replay_output_len(&ign, 100), 5, "stop id 13 still stops");
    assert_eq!(replay_output_len(&ign, 5), 2, "prompt 3 + 2 reaches 5");
    let capped = TraceRequest { max_tokens: 2, ..r };
    assert_eq!(replay_output_len(&capped, 100), 2);
}
