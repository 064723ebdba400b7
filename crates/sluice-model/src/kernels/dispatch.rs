//! Run-time CPU feature detection and the choice of kernel path.
//!
//! Owns: which SIMD implementation a matmul runs on. Promises: a path is only
//! ever executed on a CPU that has every feature it was compiled for — asking
//! for a path the CPU lacks (through `SLUICE_KERNEL` or `set_kernel_path`)
//! silently falls back to the best path the CPU does have, so no setting can
//! lead to an illegal instruction.
//!
//! The binary itself stays portable: nothing here needs `-C target-cpu`; the
//! SIMD functions carry `#[target_feature(enable = ...)]` and are only called
//! after `is_x86_feature_detected!` said yes.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A family of kernels. The same path name covers both weight dtypes:
///
/// | path      | f32 weights        | bf16 weights                                   |
/// |-----------|--------------------|------------------------------------------------|
/// | `Avx512`  | AVX-512F FMA       | AVX-512 BF16 `vdpbf16ps` (activations → bf16)  |
/// | `Avx2`    | AVX2 + FMA         | AVX2 + FMA, weights widened to f32 by a shift |
/// | `Portable`| plain Rust         | plain Rust, weights widened to f32             |
///
/// On a CPU with AVX-512F but without AVX-512 BF16, bf16 weights use `Avx2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelPath {
    Portable,
    Avx2,
    Avx512,
}

impl KernelPath {
    pub const ALL: [KernelPath; 3] = [KernelPath::Portable, KernelPath::Avx2, KernelPath::Avx512];

    /// The name used by `SLUICE_KERNEL`.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Portable => "portable",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
        }
    }

    /// Parses a `SLUICE_KERNEL` value (case-insensitive). `auto` and the
    /// empty string mean "no override" and give `Ok(None)`.
    pub fn parse(s: &str) -> Result<Option<KernelPath>, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "portable" | "scalar" | "generic" => Ok(Some(KernelPath::Portable)),
            "avx2" => Ok(Some(KernelPath::Avx2)),
            "avx512" | "avx-512" | "avx512bf16" => Ok(Some(KernelPath::Avx512)),
            other => Err(format!(
                "SLUICE_KERNEL={other:?} is not one of auto, portable, avx2, avx512"
            )),
        }
    }

    fn code(self) -> u8 {
        match self {
            KernelPath::Portable => 1,
            KernelPath::Avx2 => 2,
            KernelPath::Avx512 => 3,
        }
    }

    fn from_code(c: u8) -> Option<KernelPath> {
        match c {
            1 => Some(KernelPath::Portable),
            2 => Some(KernelPath::Avx2),
            3 => Some(KernelPath::Avx512),
            _ => None,
        }
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The CPU features the kernels care about, detected once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512bf16: bool,
}

impl CpuFeatures {
    fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx2: is_x86_feature_detected!("avx2"),
                fma: is_x86_feature_detected!("fma"),
                avx512f: is_x86_feature_detected!("avx512f"),
                avx512bw: is_x86_feature_detected!("avx512bw"),
                avx512vl: is_x86_feature_detected!("avx512vl"),
                avx512bf16: is_x86_feature_detected!("avx512bf16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }

    /// AVX2 + FMA kernels can run.
    pub fn has_avx2(&self) -> bool {
        self.avx2 && self.fma
    }

    /// AVX-512F f32 kernels can run (masked f32 loads need only AVX-512F).
    pub fn has_avx512_f32(&self) -> bool {
        self.avx512f && self.has_avx2()
    }

    /// AVX-512 BF16 kernels can run (16-bit masked loads need BW, the
    /// 256-bit bf16 conversions VL).
    pub fn has_avx512_bf16(&self) -> bool {
        self.has_avx512_f32() && self.avx512bw && self.avx512vl && self.avx512bf16
    }

    /// The best path for f32 weights.
    pub fn best_f32(&self) -> KernelPath {
        if self.has_avx512_f32() {
            KernelPath::Avx512
        } else if self.has_avx2() {
            KernelPath::Avx2
        } else {
            KernelPath::Portable
        }
    }

    /// The best path for bf16 weights.
    pub fn best_bf16(&self) -> KernelPath {
        if self.has_avx512_bf16() {
            KernelPath::Avx512
        } else if self.has_avx2() {
            KernelPath::Avx2
        } else {
            KernelPath::Portable
        }
    }

    /// `want`, lowered until this CPU can run it for f32 weights.
    pub fn clamp_f32(&self, want: KernelPath) -> KernelPath {
        want.min(self.best_f32())
    }

    /// `want`, lowered until this CPU can run it for bf16 weights.
    pub fn clamp_bf16(&self, want: KernelPath) -> KernelPath {
        want.min(self.best_bf16())
    }
}

impl fmt::Display for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = [
            ("avx2", self.avx2),
            ("fma", self.fma),
            ("avx512f", self.avx512f),
            ("avx512bw", self.avx512bw),
            ("avx512vl", self.avx512vl),
            ("avx512bf16", self.avx512bf16),
        ];
        let on: Vec<&str> = flags.iter().filter(|(_, v)| *v).map(|(n, _)| *n).collect();
        write!(
            f,
            "cpu features [{}]; matmul path: f32 weights {}, bf16 weights {}",
            if on.is_empty() {
                "none".to_string()
            } else {
                on.join(" ")
            },
            self.clamp_f32(active_request()),
            self.clamp_bf16(active_request()),
        )
    }
}

/// The detected features of this CPU (cached).
pub fn cpu_features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(CpuFeatures::detect)
}

/// 0: no programmatic override; otherwise `KernelPath::code`.
static OVERRIDE: AtomicU8 = AtomicU8::new(0);

fn env_request() -> Option<KernelPath> {
    static ENV: OnceLock<Option<KernelPath>> = OnceLock::new();
    *ENV.get_or_init(|| {
        let v = std::env::var("SLUICE_KERNEL").ok()?;
        match KernelPath::parse(&v) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("sluice: {e}; using automatic kernel selection");
                None
            }
        }
    })
}

/// The path asked for: `set_kernel_path`, else `SLUICE_KERNEL`, else the
/// best (AVX-512). Not yet clamped to what the CPU has.
fn active_request() -> KernelPath {
    KernelPath::from_code(OVERRIDE.load(Ordering::Relaxed))
        .or_else(env_request)
        .unwrap_or(KernelPath::Avx512)
}

/// Forces a path for all later `matmul` calls of the process (`None` goes
/// back to `SLUICE_KERNEL` / automatic). The request is clamped to what the
/// CPU supports at each call. Meant for benchmarks and tools; tests that run
/// concurrently should use `matmul_with` instead.
pub fn set_kernel_path(path: Option<KernelPath>) {
    OVERRIDE.store(path.map_or(0, KernelPath::code), Ordering::Relaxed);
}

/// The path `matmul` uses for f32 weights on this CPU now.
pub fn kernel_path_f32() -> KernelPath {
    cpu_features().clamp_f32(active_request())
}

/// The path `matmul` uses for bf16 weights on this CPU now.
pub fn kernel_path_bf16() -> KernelPath {
    cpu_features().clamp_bf16(active_request())
}

/// The path a call without an explicit path request resolves to.
pub(crate) fn requested_path() -> KernelPath {
    active_request()
}
