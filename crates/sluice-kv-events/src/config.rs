//! `KvEventsConfig`: vLLM 0.33's `KVEventsConfig` (`vllm/config/kv_events.py`)
//! with the same field names and defaults, read from the JSON object that
//! `--kv-events-config` takes (as `vllm serve --kv-events-config` does).
//!
//! Promise: a config that parses and validates can be handed to
//! [`crate::ZmqEventPublisher::start`]; anything else is a [`ConfigError`]
//! naming the offending field (an unknown key included), never a panic.

use serde_json::{Map, Value};
use std::fmt;

/// vLLM's default PUB endpoint: bound on all interfaces, port 5557.
pub const DEFAULT_ENDPOINT: &str = "tcp://*:5557";

/// Which publisher to run (vLLM's `publisher: Literal["null", "zmq"]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublisherKind {
    /// Events are taken from the scheduler and thrown away.
    Null,
    Zmq,
}

/// vLLM's `KVEventsConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsConfig {
    /// Whether the scheduler records KV cache events at all.
    pub enable_kv_cache_events: bool,
    /// vLLM leaves it `None` and resolves it in `__post_init__`: `zmq` when
    /// events are enabled, else `null`; [`KvEventsConfig::from_json`] does
    /// the same.
    pub publisher: PublisherKind,
    /// PUB address: bound when it has `*` or `::` in it (`tcp://*:5557`),
    /// connected to otherwise (`tcp://host:5557`), as vLLM decides.
    pub endpoint: String,
    /// ROUTER address for replay requests (always bound); `None`: no replay.
    pub replay_endpoint: Option<String>,
    /// How many past batches are kept for replay.
    pub buffer_steps: usize,
    /// vLLM's PUB send high-water mark. Accepted for compatibility; the
    /// pure-Rust `zeromq` crate has no HWM option: its PUB socket keeps a
    /// fixed per-subscriber queue and drops for a subscriber whose queue is
    /// full, which is the behaviour HWM selects in libzmq.
    pub hwm: usize,
    /// Most batches waiting between the engine thread and the publisher
    /// thread; beyond it a batch is dropped (and counted), the engine never
    /// waits.
    pub max_queue_size: usize,
    /// First frame of every PUB message.
    pub topic: String,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            enable_kv_cache_events: false,
            publisher: PublisherKind::Null,
            endpoint: DEFAULT_ENDPOINT.to_string(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

/// A refused config: which field, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

impl KvEventsConfig {
    /// Parses vLLM's JSON form, e.g.
    /// `{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}`.
    /// Fields are read one by one (not through serde's derive) so a wrong
    /// type names its field, not a column.
    pub fn from_json(text: &str) -> Result<KvEventsConfig, ConfigError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ConfigError::new("", format!("not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(ConfigError::new("", "must be a JSON object"));
        };
        Self::from_map(&map)
    }

    fn from_map(map: &Map<String, Value>) -> Result<KvEventsConfig, ConfigError> {
        let mut c = KvEventsConfig::default();
        let mut publisher: Option<PublisherKind> = None;
        for (key, v) in map {
            match key.as_str() {
                "enable_kv_cache_events" => c.enable_kv_cache_events = bool_field(key, v)?,
                "publisher" => {
                    publisher = match v {
                        Value::Null => None,
                        Value::String(s) if s == "null" => Some(PublisherKind::Null),
                        Value::String(s) if s == "zmq" => Some(PublisherKind::Zmq),
                        _ => {
                            return Err(ConfigError::new(
                                key.clone(),
                                format!("must be \"null\" or \"zmq\", got {v}"),
                            ))
                        }
                    }
                }
                "endpoint" => c.endpoint = string_field(key, v)?,
                "replay_endpoint" => {
                    c.replay_endpoint = match v {
                        Value::Null => None,
                        _ => Some(string_field(key, v)?),
                    }
                }
                "buffer_steps" => c.buffer_steps = count_field(key, v)?,
                "hwm" => c.hwm = count_field(key, v)?,
                "max_queue_size" => c.max_queue_size = count_field(key, v)?,
                "topic" => c.topic = string_field(key, v)?,
                _ => {
                    return Err(ConfigError::new(
                        key.clone(),
                        "unknown field (expected one of enable_kv_cache_events, publisher, \
                         endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic)",
                    ))
                }
            }
        }
        // vLLM's __post_init__.
        c.publisher = publisher.unwrap_or(if c.enable_kv_cache_events {
            PublisherKind::Zmq
        } else {
            PublisherKind::Null
        });
        c.validate()?;
        Ok(c)
    }

    /// Whether a ZMQ publisher should run (vLLM's `EventPublisherFactory`
    /// builds a null one unless events are enabled and `publisher` is zmq).
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher == PublisherKind::Zmq
    }

    /// Checks what the publisher would otherwise fail on at bind time.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_endpoint("endpoint", &self.endpoint)?;
        if let Some(r) = &self.replay_endpoint {
            check_endpoint("replay_endpoint", r)?;
        }
        // Python's Queue(maxsize=0) is unbounded; an unbounded queue is what
        // the bound is there to prevent, so 0 is refused instead.
        if self.max_queue_size == 0 {
            return Err(ConfigError::new("max_queue_size", "must be at least 1"));
        }
        Ok(())
    }
}

fn bool_field(key: &str, v: &Value) -> Result<bool, ConfigError> {
    v.as_bool()
        .ok_or_else(|| ConfigError::new(key, format!("must be true or false, got {v}")))
}

fn string_field(key: &str, v: &Value) -> Result<String, ConfigError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ConfigError::new(key, format!("must be a string, got {v}")))
}

fn count_field(key: &str, v: &Value) -> Result<usize, ConfigError> {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| ConfigError::new(key, format!("must be a non-negative integer, got {v}")))
}

/// `tcp://HOST:PORT` with a port that fits in 16 bits. ipc:// and
/// inproc:// (which vLLM also takes) are refused: this build has only the
/// TCP transport, and inproc cannot cross a process anyway.
fn check_endpoint(field: &str, endpoint: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| {
        ConfigError::new(
            field,
            format!("{endpoint:?}: {why} (expected tcp://HOST:PORT, e.g. {DEFAULT_ENDPOINT})"),
        )
    };
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return Err(bad("only tcp:// endpoints are supported"));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(bad("no port"));
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    port.parse::<u16>()
        .map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_vllms() {
        let c = KvEventsConfig::from_json("{}").expect("empty object");
        assert_eq!(c, KvEventsConfig::default());
        assert!(!c.publishes());
        assert_eq!(c.endpoint, "tcp://*:5557");
        assert_eq!(
            (c.buffer_steps, c.hwm, c.max_queue_size),
            (10_000, 100_000, 100_000)
        );
    }

    #[test]
    fn publisher_resolves_as_post_init_does() {
        let c = KvEventsConfig::from_json(r#"{"enable_kv_cache_events": true}"#).expect("ok");
        assert_eq!(c.publisher, PublisherKind::Zmq);
        assert!(c.publishes());
        let c = KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events": true, "publisher": "null", "topic": "kv",
                "replay_endpoint": "tcp://*:5558", "buffer_steps": 3, "hwm": 7,
                "max_queue_size": 9, "endpoint": "tcp://10.0.0.1:6000"}"#,
        )
        .expect("ok");
        assert!(!c.publishes());
        assert_eq!(c.topic, "kv");
        assert_eq!(c.replay_endpoint.as_deref(), Some("tcp://*:5558"));
        assert_eq!((c.buffer_steps, c.hwm, c.max_queue_size), (3, 7, 9));
    }

    #[test]
    fn bad_configs_name_their_field() {
        for (json, field) in [
            (
                r#"{"enable_kv_cache_event": true}"#,
                "enable_kv_cache_event",
            ),
            (
                r#"{"enable_kv_cache_events": "yes"}"#,
                "enable_kv_cache_events",
            ),
            (r#"{"publisher": "kafka"}"#, "publisher"),
            (r#"{"buffer_steps": -1}"#, "buffer_steps"),
            (r#"{"hwm": 1.5}"#, "hwm"),
            (r#"{"max_queue_size": 0}"#, "max_queue_size"),
            (r#"{"topic": 3}"#, "topic"),
            (r#"{"endpoint": "ipc:///tmp/x"}"#, "endpoint"),
            (r#"{"endpoint": "tcp://*:99999"}"#, "endpoint"),
            (r#"{"replay_endpoint": "tcp://nohost"}"#, "replay_endpoint"),
        ] {
            let e = KvEventsConfig::from_json(json).expect_err(json);
            assert_eq!(e.field, field, "{json}: {e}");
            assert!(e.to_string().starts_with(field), "{e}");
        }
        assert!(KvEventsConfig::from_json("{").is_err());
        assert!(KvEventsConfig::from_json("[1]").is_err());
    }
}
