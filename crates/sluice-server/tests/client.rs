//! The client key of a request: the client-id header wins over the body's
//! `user`, which wins over the authenticating API key; empty values count
//! as absent. The API key's label is `key:` and the first 8 hex digits of
//! its SHA-256 (the digest below is `sha256sum`'s, not this crate's).

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use sluice_server::client::{client_key, header_name, ApiKeyClient, DEFAULT_CLIENT_ID_HEADER};

/// `printf 'sk-test-123' | sha256sum` starts with these 8 hex digits.
const KEY_LABEL: &str = "key:e0dbaa0c";

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

#[test]
fn an_api_key_is_labelled_by_its_digest_never_itself() {
    let label = ApiKeyClient::of("sk-test-123");
    assert_eq!(label.0, KEY_LABEL);
    assert!(!label.0.contains("sk-test"));
}

#[test]
fn the_header_wins_then_user_then_the_api_key() {
    let name = header_name(DEFAULT_CLIENT_ID_HEADER).unwrap();
    let key = ApiKeyClient::of("sk-test-123");
    let gateway = headers(&[(DEFAULT_CLIENT_ID_HEADER, "tenant-a")]);
    let none = HeaderMap::new();

    let all = client_key(&gateway, &name, Some("alice"), Some(&key));
    assert_eq!(all.as_deref(), Some("tenant-a"));
    let user_and_key = client_key(&none, &name, Some("alice"), Some(&key));
    assert_eq!(user_and_key.as_deref(), Some("alice"));
    let key_only = client_key(&none, &name, None, Some(&key));
    assert_eq!(key_only.as_deref(), Some(KEY_LABEL));
    assert_eq!(client_key(&none, &name, None, None), None);
}

#[test]
fn empty_values_fall_through_to_the_next_source() {
    let name = header_name(DEFAULT_CLIENT_ID_HEADER).unwrap();
    let key = ApiKeyClient::of("sk-test-123");
    let empty = headers(&[(DEFAULT_CLIENT_ID_HEADER, "  ")]);
    assert_eq!(
        client_key(&empty, &name, Some(""), Some(&key)).as_deref(),
        Some(KEY_LABEL)
    );
    assert_eq!(
        client_key(&empty, &name, Some("bob"), None).as_deref(),
        Some("bob")
    );
}

#[test]
fn the_header_is_the_one_configured_matched_without_case() {
    let name = header_name("X-Tenant").unwrap();
    let h = headers(&[
        ("x-tenant", "t1"),
        (DEFAULT_CLIENT_ID_HEADER, "from-the-default-header"),
    ]);
    assert_eq!(client_key(&h, &name, None, None).as_deref(), Some("t1"));
}

#[test]
fn a_header_name_that_is_not_a_token_is_refused_naming_the_flag() {
    let err = header_name("x tenant").unwrap_err().to_string();
    assert!(err.contains("--client-id-header"), "{err}");
    assert!(header_name("x:tenant").is_err());
}
