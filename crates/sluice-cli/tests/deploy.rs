//! deploy/kubernetes/ against the binary it runs: every flag in the
//! container's args is one `sluice serve --help` lists (strict: a flag not
//! merged yet fails here), and the ports and probe paths agree with each
//! other and with what `sluice serve` really serves (`/health`, `/ready`,
//! `/metrics` on the `--port`).

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

fn load(name: &str) -> Yaml {
    let path = format!(
        "{}/../../deploy/kubernetes/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(docs.len(), 1, "{path}: one object per file");
    docs.remove(0)
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

fn int_of(y: &Yaml, what: &str) -> i64 {
    match y {
        Yaml::Integer(i) => *i,
        Yaml::String(s) => s.parse().unwrap_or_else(|_| panic!("{what}: {s:?}")),
        _ => panic!("{what} is not a number: {y:?}"),
    }
}

/// The value after `flag` in `args`.
fn arg<'a>(args: &'a [String], flag: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} is not in the args {args:?}"));
    args.get(i + 1)
        .unwrap_or_else(|| panic!("{flag} has no value"))
}

/// The long flags `sluice serve --help` documents.
fn serve_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--help"])
        .output()
        .expect("sluice serve --help runs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == ']')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .collect()
}

struct Deploy {
    container: Yaml,
    pod: Yaml,
    args: Vec<String>,
    /// containerPort of the port named `http`.
    http_port: i64,
}

fn deployment() -> Deploy {
    let d = load("deployment.yaml");
    assert_eq!(str_of(&d["kind"], "kind"), "Deployment");
    let pod = d["spec"]["template"].clone();
    let containers = pod["spec"]["containers"].as_vec().expect("containers");
    let container = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("sluice"))
        .expect("a container named sluice")
        .clone();
    let mut args: Vec<String> = container["command"]
        .as_vec()
        .map(|c| c.iter().map(|a| str_of(a, "command").to_string()).collect())
        .unwrap_or_default();
    args.extend(
        container["args"]
            .as_vec()
            .expect("args")
            .iter()
            .map(|a| match a {
                Yaml::Integer(i) => i.to_string(),
                a => str_of(a, "an arg").to_string(),
            }),
    );
    assert_eq!(
        args[..2],
        ["sluice", "serve"],
        "runs sluice serve: {args:?}"
    );
    let http_port = container["ports"]
        .as_vec()
        .expect("ports")
        .iter()
        .find(|p| p["name"].as_str() == Some("http"))
        .map(|p| int_of(&p["containerPort"], "containerPort"))
        .expect("a port named http");
    Deploy {
        container,
        pod,
        args,
        http_port,
    }
}

/// A probe's or Service's port: a number, or the name of a container port.
fn resolve_port(d: &Deploy, port: &Yaml) -> i64 {
    match port {
        Yaml::String(name) => d.container["ports"]
            .as_vec()
            .expect("ports")
            .iter()
            .find(|p| p["name"].as_str() == Some(name.as_str()))
            .map(|p| int_of(&p["containerPort"], "containerPort"))
            .unwrap_or_else(|| panic!("no container port named {name}")),
        p => int_of(p, "port"),
    }
}

#[test]
fn every_flag_in_the_deployment_is_a_serve_flag() {
    let d = deployment();
    let known = serve_flags();
    assert!(
        known.contains("--port") && known.contains("--host"),
        "{known:?}"
    );
    let used: Vec<&str> = d.args[2..]
        .iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap_or(a))
        .collect();
    let missing: Vec<&&str> = used.iter().filter(|f| !known.contains(**f)).collect();
    assert!(
        missing.is_empty(),
        "flags the deployment passes that `sluice serve --help` does not list: {missing:?}"
    );
    // The KV events flag is llm-d's contract: its JSON must parse.
    let kv: serde_json::Value =
        serde_json::from_str(arg(&d.args, "--kv-events-config")).expect("--kv-events-config JSON");
    assert_eq!(kv["enable_kv_cache_events"], true);
    assert_eq!(kv["publisher"], "zmq");
    let endpoint = kv["endpoint"].as_str().expect("endpoint");
    let kv_port: i64 = endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("endpoint port");
    assert_eq!(
        resolve_port(&d, &Yaml::String("kv-events".into())),
        kv_port,
        "the container exposes the events port"
    );
}

#[test]
fn ports_probes_and_the_pool_agree() {
    let d = deployment();
    assert_eq!(
        arg(&d.args, "--host"),
        "0.0.0.0",
        "reachable from other pods"
    );
    let port: i64 = arg(&d.args, "--port").parse().expect("--port N");
    assert_eq!(port, d.http_port, "--port is the container's http port");
    assert_eq!(port, 8000, "vLLM's port, where routers look");

    for (probe, path) in [
        ("livenessProbe", "/health"),
        ("readinessProbe", "/ready"),
        ("startupProbe", "/health"),
    ] {
        let p = &d.container[probe]["httpGet"];
        assert_eq!(str_of(&p["path"], probe), path, "{probe}");
        assert_eq!(resolve_port(&d, &p["port"]), port, "{probe} port");
    }
    let annotations = &d.pod["metadata"]["annotations"];
    assert_eq!(
        str_of(&annotations["prometheus.io/path"], "path"),
        "/metrics"
    );
    assert_eq!(int_of(&annotations["prometheus.io/port"], "port"), port);

    // SIGKILL must not cut the drain short.
    let grace: i64 = arg(&d.args, "--shutdown-grace-secs").parse().expect("secs");
    let pre_stop = match &d.container["lifecycle"]["preStop"]["sleep"]["seconds"] {
        Yaml::BadValue => 0,
        s => int_of(s, "preStop sleep"),
    };
    let termination = int_of(
        &d.pod["spec"]["terminationGracePeriodSeconds"],
        "terminationGracePeriodSeconds",
    );
    assert!(
        termination > grace + pre_stop,
        "terminationGracePeriodSeconds {termination} <= preStop {pre_stop} + grace {grace}"
    );

    let labels = d.pod["metadata"]["labels"].as_hash().expect("pod labels");
    let selects = |selector: &Yaml, what: &str| {
        for (k, v) in selector.as_hash().unwrap_or_else(|| panic!("{what}")) {
            assert_eq!(labels.get(k), Some(v), "{what} {k:?} matches the pods");
        }
    };

    let svc = load("service.yaml");
    assert_eq!(str_of(&svc["kind"], "kind"), "Service");
    selects(&svc["spec"]["selector"], "the Service selector");
    let svc_port = &svc["spec"]["ports"][0];
    assert_eq!(resolve_port(&d, &svc_port["targetPort"]), port);

    let pool = load("inferencepool.yaml");
    assert_eq!(
        str_of(&pool["apiVersion"], "apiVersion"),
        "inference.networking.k8s.io/v1"
    );
    assert_eq!(str_of(&pool["kind"], "kind"), "InferencePool");
    selects(
        &pool["spec"]["selector"]["matchLabels"],
        "the pool selector",
    );
    let targets = pool["spec"]["targetPorts"].as_vec().expect("targetPorts");
    assert_eq!(targets.len(), 1);
    assert_eq!(int_of(&targets[0]["number"], "targetPorts.number"), port);
    let picker = &pool["spec"]["endpointPickerRef"];
    assert!(!str_of(&picker["name"], "endpointPickerRef.name").is_empty());
    int_of(&picker["port"]["number"], "endpointPickerRef.port.number");
}

/// The probe and metrics paths are real: the running binary answers them
/// on its port.
#[test]
fn serve_answers_the_probe_and_metrics_paths() {
    let mut serve = common::spawn_serve(&[], &[]);
    let url = serve.url.clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        for path in ["/health", "/ready", "/metrics"] {
            let r = reqwest::get(format!("{url}{path}")).await.expect(path);
            assert_eq!(r.status(), 200, "{path}");
        }
        let text = reqwest::get(format!("{url}/metrics"))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        for family in [
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info",
            "vllm:lora_requests_info",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{family} missing"
            );
        }
    });
    serve.terminate_and_wait();
}
