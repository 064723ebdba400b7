//! [`Hardware`]: one accelerator's peak FLOP/s, bandwidths, memory and
//! the unfitted efficiencies the roofline applies, and the built-in
//! profiles of `profiles/hardware.json` (each figure with its source),
//! parsed once. Errors name the profile and the field.

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// One accelerator, with what the roofline and the KV sizing need.
/// Figures of the built-ins are in `profiles/hardware.json`, each with
/// its source.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hardware {
    /// FLOP/s, dense bf16.
    pub peak_flops: f64,
    /// Device memory bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// Device memory the driver reports, bytes (what vLLM multiplies by
    /// `--gpu-memory-utilization`).
    pub memory_bytes: f64,
    /// GPU-to-GPU bandwidth per GPU, both directions together as NVIDIA
    /// quotes it (NVLink, or PCIe without it), bytes/s.
    pub interconnect_bandwidth: f64,
    /// Fraction of `peak_flops` a GEMM reaches.
    pub matmul_efficiency: f64,
    /// Fraction of `hbm_bandwidth` a streaming kernel reaches.
    pub bandwidth_efficiency: f64,
    /// Fraction of the per-direction interconnect bandwidth an all-reduce
    /// reaches.
    pub interconnect_efficiency: f64,
    /// Fixed cost of one all-reduce, seconds.
    pub collective_latency_s: f64,
    /// Fixed cost of every step (scheduling, launches, sampling).
    pub step_overhead_s: f64,
    /// Per-GPU memory besides weights and KV cache (activation peak,
    /// workspaces, CUDA graphs), bytes.
    pub activation_reserve_bytes: f64,
}

/// Unfitted defaults shared by the built-ins (`profiles/hardware.json`'s
/// `defaults`, checked equal by a test).
const MATMUL_EFF: f64 = 0.7;
const BANDWIDTH_EFF: f64 = 0.8;
const INTERCONNECT_EFF: f64 = 0.8;
const NVLINK_LATENCY_S: f64 = 8e-6;
const STEP_OVERHEAD_S: f64 = 0.002;
const ACTIVATION_RESERVE: f64 = 2.0 * GIB;
pub(super) const GB: f64 = 1e9;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const TFLOPS: f64 = 1e12;

/// The profile file, the source of truth for [`Hardware::builtin`].
pub const HARDWARE_PROFILES_JSON: &str = include_str!("../../profiles/hardware.json");

/// One built-in profile of `profiles/hardware.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltinHardware {
    pub name: String,
    pub aliases: Vec<String>,
    pub description: String,
    pub hardware: Hardware,
    /// `(field, source)` for every field, defaults included.
    pub sources: Vec<(String, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sourced {
    value: f64,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileEntry {
    name: String,
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    description: String,
    fields: std::collections::BTreeMap<String, Sourced>,
}

#[derive(Deserialize)]
struct ProfilesFile {
    defaults: std::collections::BTreeMap<String, Sourced>,
    profiles: Vec<ProfileEntry>,
}

/// Parses a profiles file of `profiles/hardware.json`'s format. Errors
/// name the profile and field.
pub fn parse_hardware_profiles(text: &str) -> Result<Vec<BuiltinHardware>, String> {
    let file: ProfilesFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(file.profiles.len());
    for p in file.profiles {
        let mut fields = serde_json::Map::new();
        let mut sources = Vec::new();
        for (k, s) in file.defaults.iter().chain(p.fields.iter()) {
            fields.insert(k.clone(), serde_json::json!(s.value));
            sources.retain(|(f, _): &(String, String)| f != k);
            sources.push((k.clone(), s.source.clone()));
        }
        let hardware: Hardware = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|e| format!("profile `{}`: {e}", p.name))?;
        hardware
            .validate()
            .map_err(|e| format!("profile `{}`: {e}", p.name))?;
        out.push(BuiltinHardware {
            name: p.name,
            aliases: p.aliases,
            description: p.description,
            hardware,
            sources,
        });
    }
    Ok(out)
}

impl Hardware {
    const fn datasheet(
        tflops: f64,
        gb_per_s: f64,
        memory_bytes: f64,
        interconnect_gb_per_s: f64,
        collective_latency_s: f64,
    ) -> Hardware {
        Hardware {
            peak_flops: tflops * TFLOPS,
            hbm_bandwidth: gb_per_s * GB,
            memory_bytes,
            interconnect_bandwidth: interconnect_gb_per_s * GB,
            matmul_efficiency: MATMUL_EFF,
            bandwidth_efficiency: BANDWIDTH_EFF,
            interconnect_efficiency: INTERCONNECT_EFF,
            collective_latency_s,
            step_overhead_s: STEP_OVERHEAD_S,
            activation_reserve_bytes: ACTIVATION_RESERVE,
        }
    }

    // Compile-time copies of the profile file's built-ins, for code and
    // tests that want a constant; `consts_match_the_profile_file` keeps
    // them equal to the file, which `builtin` reads.

    /// A100 80GB SXM: 312 TFLOPS bf16, 2,039 GB/s, 81,920 MiB, NVLink
    /// 600 GB/s.
    pub const A100_80GB: Hardware =
        Hardware::datasheet(312.0, 2039.0, 81_920.0 * MIB, 600.0, NVLINK_LATENCY_S);
    /// H100 SXM: 989 TFLOPS bf16, 3.35 TB/s, 81,559 MiB, NVLink 900 GB/s.
    pub const H100_SXM: Hardware =
        Hardware::datasheet(989.0, 3350.0, 81_559.0 * MIB, 900.0, NVLINK_LATENCY_S);
    /// H200 SXM: 989 TFLOPS bf16, 4.8 TB/s, 143,771 MiB, NVLink 900 GB/s.
    pub const H200: Hardware =
        Hardware::datasheet(989.0, 4800.0, 143_771.0 * MIB, 900.0, NVLINK_LATENCY_S);
    /// L40S: 362.05 TFLOPS bf16, 864 GB/s, 46,068 MiB, PCIe Gen4 x16
    /// 64 GB/s.
    pub const L40S: Hardware = Hardware {
        // Written out so that it is the same double the file's 362.05e12
        // parses to (362.05 × 1e12 rounds differently).
        peak_flops: 362.05e12,
        ..Hardware::datasheet(362.0, 864.0, 46_068.0 * MIB, 64.0, 25e-6)
    };
    /// B200 (DGX / HGX, per GPU): 2.25 PFLOPS bf16, 8 TB/s, 180 GB,
    /// NVLink 1.8 TB/s.
    pub const B200: Hardware =
        Hardware::datasheet(2250.0, 8000.0, 180.0 * GB, 1800.0, NVLINK_LATENCY_S);

    /// The built-in profiles of `profiles/hardware.json`, parsed once.
    pub fn builtin_profiles() -> Result<&'static [BuiltinHardware], String> {
        static PARSED: OnceLock<Result<Vec<BuiltinHardware>, String>> = OnceLock::new();
        match PARSED.get_or_init(|| parse_hardware_profiles(HARDWARE_PROFILES_JSON)) {
            Ok(v) => Ok(v),
            Err(e) => Err(format!("profiles/hardware.json: {e}")),
        }
    }

    /// A built-in profile by name or alias, case-insensitive.
    pub fn builtin(name: &str) -> Option<Hardware> {
        Self::builtin_profile(name).map(|p| p.hardware)
    }

    /// A built-in profile, with its sources, by name or alias.
    pub fn builtin_profile(name: &str) -> Option<&'static BuiltinHardware> {
        let name = name.trim();
        Self::builtin_profiles().ok()?.iter().find(|p| {
            p.name.eq_ignore_ascii_case(name)
                || p.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
        })
    }

    /// The built-in profiles' names.
    pub fn builtin_names() -> Vec<&'static str> {
        Self::builtin_profiles()
            .map(|ps| ps.iter().map(|p| p.name.as_str()).collect())
            .unwrap_or_default()
    }

    /// Every figure finite, rates and sizes positive, efficiencies in
    /// (0, 1], costs non-negative. Errors name the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("peak_flops", self.peak_flops),
            ("hbm_bandwidth", self.hbm_bandwidth),
            ("memory_bytes", self.memory_bytes),
            ("interconnect_bandwidth", self.interconnect_bandwidth),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("`{name}`: expected a positive number, found {v}"));
            }
        }
        for (name, v) in [
            ("matmul_efficiency", self.matmul_efficiency),
            ("bandwidth_efficiency", self.bandwidth_efficiency),
            ("interconnect_efficiency", self.interconnect_efficiency),
        ] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(format!(
                    "`{name}`: expected a fraction in (0, 1], found {v}"
                ));
            }
        }
        for (name, v) in [
            ("collective_latency_s", self.collective_latency_s),
            ("step_overhead_s", self.step_overhead_s),
            ("activation_reserve_bytes", self.activation_reserve_bytes),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "`{name}`: expected a non-negative number, found {v}"
                ));
            }
        }
        Ok(())
    }

    pub(super) fn compute_s(&self, flops: f64) -> f64 {
        flops / (self.peak_flops * self.matmul_efficiency)
    }

    pub(super) fn memory_s(&self, bytes: f64) -> f64 {
        bytes / (self.hbm_bandwidth * self.bandwidth_efficiency)
    }

    pub(super) fn roof(&self, flops: f64, bytes: f64) -> f64 {
        self.compute_s(flops).max(self.memory_s(bytes))
    }

    /// One ring all-reduce of `bytes` over `tp` GPUs: each sends and
    /// receives `2(tp−1)/tp × bytes`, at once, at half the quoted
    /// bidirectional bandwidth each way.
    pub fn all_reduce_s(&self, bytes: f64, tp: usize) -> f64 {
        if tp <= 1 {
            return 0.0;
        }
        let tp = tp as f64;
        let per_direction = self.interconnect_bandwidth / 2.0 * self.interconnect_efficiency;
        self.collective_latency_s + 2.0 * (tp - 1.0) / tp * bytes / per_direction
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HW: Hardware = Hardware {
        peak_flops: 1000.0,
        hbm_bandwidth: 100.0,
        memory_bytes: 1e9,
        interconnect_bandwidth: 200.0,
        matmul_efficiency: 0.5,
        bandwidth_efficiency: 1.0,
        interconnect_efficiency: 1.0,
        collective_latency_s: 0.5,
        step_overhead_s: 0.25,
        activation_reserve_bytes: 0.0,
    };

    #[test]
    fn consts_match_the_profile_file() {
        let profiles = Hardware::builtin_profiles().unwrap();
        assert_eq!(profiles.len(), 5);
        for (name, c) in [
            ("A100-80GB", Hardware::A100_80GB),
            ("H100-SXM", Hardware::H100_SXM),
            ("H200", Hardware::H200),
            ("L40S", Hardware::L40S),
            ("B200", Hardware::B200),
        ] {
            let p = Hardware::builtin_profile(name).unwrap();
            assert_eq!(p.hardware, c, "{name}");
            // Every field has a source, and a non-empty one.
            assert_eq!(p.sources.len(), 10, "{name}");
            assert!(p.sources.iter().all(|(_, s)| s.len() > 10), "{name}");
        }
        assert_eq!(Hardware::builtin("h100"), Some(Hardware::H100_SXM));
        assert_eq!(Hardware::builtin("a100"), Some(Hardware::A100_80GB));
        assert_eq!(Hardware::builtin("tpu-v5"), None);
    }

    #[test]
    fn a_bad_profiles_file_names_the_profile_and_field() {
        let text = r#"{"defaults": {}, "profiles": [{"name": "X", "fields": {
            "peak_flops": {"value": 1, "source": "s"}}}]}"#;
        let err = parse_hardware_profiles(text).unwrap_err();
        assert!(
            err.contains("profile `X`") && err.contains("missing field"),
            "{err}"
        );
        let mut fields: Vec<String> = Vec::new();
        for (k, v) in serde_json::to_value(HW).unwrap().as_object().unwrap() {
            let v = if k == "matmul_efficiency" {
                serde_json::json!(1.5)
            } else {
                v.clone()
            };
            fields.push(format!(r#""{k}": {{"value": {v}, "source": "s"}}"#));
        }
        let text = format!(
            r#"{{"defaults": {{}}, "profiles": [{{"name": "Y", "fields": {{{}}}}}]}}"#,
            fields.join(",")
        );
        let err = parse_hardware_profiles(&text).unwrap_err();
        assert!(
            err.contains("profile `Y`") && err.contains("`matmul_efficiency`"),
            "{err}"
        );
    }
}
