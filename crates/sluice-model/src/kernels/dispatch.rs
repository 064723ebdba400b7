//! Run-time CPU feature detection and the choice of kernel path — the one
//! dispatch mechanism of the crate.
//!
//! Owns: which SIMD implementation every kernel runs on — matmul of every
//! weight format, attention, RMSNorm, SwiGLU, the residual add, RoPE and
//! the sampler's vocabulary-wide loops. One request (`set_kernel_path`,
//! else `SLUICE_KERNEL=portable|avx2|avx512`, else the best) caps all of
//! them; each `KernelFamily` then lowers it to what this CPU can run for
//! that family. Every kernel learns its path from [`select_path`] (the matmul
//! drivers and attention directly, the loops the compiler vectorises through
//! [`multiversion!`]), which also records it, so `last_kernel_path` tells
//! what each family actually ran on.
//!
//! Promises: a path is only ever executed on a CPU that has every feature
//! it was compiled for — asking for a path the CPU lacks silently falls
//! back to the best path the CPU does have, so no setting can lead to an
//! illegal instruction.
//!
//! The binary itself stays portable: nothing here needs `-C target-cpu`; the
//! SIMD functions carry `#[target_feature(enable = ...)]` and are only called
//! after `is_x86_feature_detected!` said yes.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// A family of kernels. What each path means per family:
///
/// | family        | `Avx512`                                   | `Avx2`                      |
/// |---------------|--------------------------------------------|-----------------------------|
/// | `F32`         | AVX-512F FMA                               | AVX2 + FMA                  |
/// | `Bf16`        | AVX-512 BF16 `vdpbf16ps` (x → bf16)        | AVX2 + FMA, widened weights |
/// | `F16`         | AVX-512F/BW/VL, `vcvtph2ps` + FMA          | AVX2 + FMA + F16C           |
/// | `Quant`       | AVX-512 VNNI `vpdpbusd` at 512 bits        | AVX2 `pmaddubsw`/`pmaddwd` (+ FMA, F16C) |
/// | `Attention`   | AVX-512F intrinsics                        | AVX2 + FMA (compiled loops) |
/// | `RmsNorm`, `SwiGlu`, `Residual`, `Rope` | AVX-512F (compiled loops) | AVX2 + FMA (compiled loops) |
/// | `Sampling`    | AVX-512F (compiled loops)                  | AVX2 + FMA (compiled loops) |
///
/// `Portable` is plain Rust everywhere. A CPU lacking a family's `Avx512`
/// features (say AVX-512F without BF16 or VNNI) runs that family on `Avx2`.
/// The compiled-loop families perform the same IEEE operations in the same
/// order on every path, so their paths differ in speed only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// Matmul with f32 weights.
    F32,
    /// Matmul with bf16 weights.
    Bf16,
    /// Matmul with f16 weights.
    F16,
    /// Matmul with block-quantized weights (every GGUF block format).
    Quant,
    /// Paged attention.
    Attention,
    /// RMSNorm of rows and of heads in place.
    RmsNorm,
    /// SwiGLU, `silu(gate) · up`.
    SwiGlu,
    /// The residual connection, `acc += x`.
    Residual,
    /// Rotary position embeddings applied to q and k.
    Rope,
    /// The sampler's vocabulary-wide loops (max, softmax sums, top-k/p).
    Sampling,
}

impl KernelFamily {
    pub const ALL: [KernelFamily; 10] = [
        KernelFamily::F32,
        KernelFamily::Bf16,
        KernelFamily::F16,
        KernelFamily::Quant,
        KernelFamily::Attention,
        KernelFamily::RmsNorm,
        KernelFamily::SwiGlu,
        KernelFamily::Residual,
        KernelFamily::Rope,
        KernelFamily::Sampling,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::F32 => "f32",
            KernelFamily::Bf16 => "bf16",
            KernelFamily::F16 => "f16",
            KernelFamily::Quant => "quantized",
            KernelFamily::Attention => "attention",
            KernelFamily::RmsNorm => "rms_norm",
            KernelFamily::SwiGlu => "swiglu",
            KernelFamily::Residual => "residual",
            KernelFamily::Rope => "rope",
            KernelFamily::Sampling => "sampling",
        }
    }

    /// Position in [`KernelFamily::ALL`].
    fn index(self) -> usize {
        self as usize
    }
}

/// A level of SIMD code. The same names cover every `KernelFamily`.
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
            "avx512" | "avx-512" | "avx512bf16" | "avx512vnni" => Ok(Some(KernelPath::Avx512)),
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
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512bf16: bool,
    pub avx512vnni: bool,
}

impl CpuFeatures {
    fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx2: is_x86_feature_detected!("avx2"),
                fma: is_x86_feature_detected!("fma"),
                f16c: is_x86_feature_detected!("f16c"),
                avx512f: is_x86_feature_detected!("avx512f"),
                avx512bw: is_x86_feature_detected!("avx512bw"),
                avx512vl: is_x86_feature_detected!("avx512vl"),
                avx512bf16: is_x86_feature_detected!("avx512bf16"),
                avx512vnni: is_x86_feature_detected!("avx512vnni"),
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

    /// AVX-512 VNNI integer kernels can run (byte masks need BW).
    pub fn has_avx512_vnni(&self) -> bool {
        self.has_avx512_f32() && self.avx512bw && self.avx512vl && self.avx512vnni
    }

    /// Whether family `f` can run on path `p` here.
    pub fn supports(&self, f: KernelFamily, p: KernelPath) -> bool {
        match p {
            KernelPath::Portable => true,
            KernelPath::Avx2 => match f {
                KernelFamily::F16 | KernelFamily::Quant => self.has_avx2() && self.f16c,
                _ => self.has_avx2(),
            },
            KernelPath::Avx512 => match f {
                KernelFamily::Bf16 => self.has_avx512_bf16(),
                KernelFamily::F16 => self.has_avx512_f32() && self.avx512bw && self.avx512vl,
                KernelFamily::Quant => self.has_avx512_vnni(),
                KernelFamily::F32
                | KernelFamily::Attention
                | KernelFamily::RmsNorm
                | KernelFamily::SwiGlu
                | KernelFamily::Residual
                | KernelFamily::Rope
                | KernelFamily::Sampling => self.has_avx512_f32(),
            },
        }
    }

    /// The best path for family `f` on this CPU.
    pub fn best(&self, f: KernelFamily) -> KernelPath {
        self.clamp(f, KernelPath::Avx512)
    }

    /// `want`, lowered until this CPU can run it for family `f`.
    pub fn clamp(&self, f: KernelFamily, want: KernelPath) -> KernelPath {
        let mut p = want;
        while !self.supports(f, p) {
            p = match p {
                KernelPath::Avx512 => KernelPath::Avx2,
                _ => KernelPath::Portable,
            };
        }
        p
    }

    /// The best path for f32 weights.
    pub fn best_f32(&self) -> KernelPath {
        self.best(KernelFamily::F32)
    }

    /// The best path for bf16 weights.
    pub fn best_bf16(&self) -> KernelPath {
        self.best(KernelFamily::Bf16)
    }

    /// `want`, lowered until this CPU can run it for f32 weights.
    pub fn clamp_f32(&self, want: KernelPath) -> KernelPath {
        self.clamp(KernelFamily::F32, want)
    }

    /// `want`, lowered until this CPU can run it for bf16 weights.
    pub fn clamp_bf16(&self, want: KernelPath) -> KernelPath {
        self.clamp(KernelFamily::Bf16, want)
    }
}

impl fmt::Display for CpuFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let flags = [
            ("avx2", self.avx2),
            ("fma", self.fma),
            ("f16c", self.f16c),
            ("avx512f", self.avx512f),
            ("avx512bw", self.avx512bw),
            ("avx512vl", self.avx512vl),
            ("avx512bf16", self.avx512bf16),
            ("avx512vnni", self.avx512vnni),
        ];
        let on: Vec<&str> = flags.iter().filter(|(_, v)| *v).map(|(n, _)| *n).collect();
        write!(
            f,
            "cpu features [{}]; kernel paths:",
            if on.is_empty() {
                "none".to_string()
            } else {
                on.join(" ")
            },
        )?;
        for (i, fam) in KernelFamily::ALL.into_iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(
                f,
                "{sep}{} {}",
                fam.name(),
                self.clamp(fam, active_request())
            )?;
        }
        Ok(())
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
    let want = KernelPath::from_code(OVERRIDE.load(Ordering::Relaxed))
        .or_else(env_request)
        .unwrap_or(KernelPath::Avx512);
    #[cfg(test)]
    let want = want.min(thread_cap::get());
    want
}

/// Forces a path for every later kernel call of the process — every
/// family of [`KernelFamily::ALL`] — (`None` goes back to `SLUICE_KERNEL` /
/// automatic). The request is clamped to what the CPU supports at each
/// call. Meant for benchmarks and tools; tests that run concurrently should
/// use `matmul_with` instead.
pub fn set_kernel_path(path: Option<KernelPath>) {
    OVERRIDE.store(path.map_or(0, KernelPath::code), Ordering::Relaxed);
}

/// The path family `f` runs on now (the request clamped to this CPU).
pub fn kernel_path(f: KernelFamily) -> KernelPath {
    cpu_features().clamp(f, active_request())
}

/// The path `matmul` uses for f32 weights on this CPU now.
pub fn kernel_path_f32() -> KernelPath {
    kernel_path(KernelFamily::F32)
}

/// The path `matmul` uses for bf16 weights on this CPU now.
pub fn kernel_path_bf16() -> KernelPath {
    kernel_path(KernelFamily::Bf16)
}

/// Per family, the `KernelPath::code` of the path its kernels last ran on
/// (0: none yet).
static LAST_RUN: [AtomicU8; KernelFamily::ALL.len()] =
    [const { AtomicU8::new(0) }; KernelFamily::ALL.len()];

/// The path the kernels of family `f` ran on at their latest call in this
/// process, `None` before the first. What [`kernel_path`] promises is what
/// this observes: every kernel takes its path from [`select_path`].
pub fn last_kernel_path(f: KernelFamily) -> Option<KernelPath> {
    KernelPath::from_code(LAST_RUN[f.index()].load(Ordering::Relaxed))
}

/// The dispatch point of every kernel: the path family `f` runs on for a
/// call asking for `want` (the process-wide request unless the call names
/// one), lowered to what this CPU has, and recorded for
/// [`last_kernel_path`].
#[inline]
pub(crate) fn select_path(f: KernelFamily, want: Option<KernelPath>) -> KernelPath {
    let path = cpu_features().clamp(f, want.unwrap_or_else(active_request));
    record_path(f, path);
    path
}

/// Records that family `f` ran on `path` (for a driver that lowered the
/// path [`select_path`] gave it further, say a format without that
/// kernel).
#[inline]
pub(crate) fn record_path(f: KernelFamily, path: KernelPath) {
    let slot = &LAST_RUN[f.index()];
    // Store only on a change, so steady-state calls from many threads
    // share the cache line instead of bouncing it.
    if slot.load(Ordering::Relaxed) != path.code() {
        slot.store(path.code(), Ordering::Relaxed);
    }
}

/// Defines `fn $name` of kernel family `$family` from a body compiled three
/// times — with AVX-512F (+ AVX2, FMA), with AVX2 + FMA, and for the
/// baseline target — and runs the one [`select_path`] picks for the family, so
/// `SLUICE_KERNEL` / `set_kernel_path` steer it like every other kernel.
/// The versions perform the same IEEE operations in the same order (Rust
/// never contracts a multiply and an add into an FMA; `mul_add` is an FMA
/// on every path), so they differ only in speed.
macro_rules! multiversion {
    ($family:ident; $(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    generic($($arg),*)
                }
                match $crate::kernels::select_path(
                    $crate::kernels::KernelFamily::$family,
                    None,
                ) {
                    // SAFETY: `select_path` only returns a path whose features
                    // this CPU has (AVX-512F, AVX2 and FMA for `Avx512`).
                    $crate::kernels::KernelPath::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `select_path` returned `Avx2`, so the CPU has AVX2
                    // and FMA.
                    $crate::kernels::KernelPath::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::kernels::KernelPath::Portable => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            $crate::kernels::select_path($crate::kernels::KernelFamily::$family, None);
            generic($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// A per-thread cap for the crate's unit tests, which run concurrently and
/// so cannot use the process-wide `set_kernel_path` to compare paths.
#[cfg(test)]
pub(crate) mod thread_cap {
    use super::KernelPath;
    use std::cell::Cell;

    thread_local! {
        static CAP: Cell<KernelPath> = const { Cell::new(KernelPath::Avx512) };
    }

    pub(crate) fn get() -> KernelPath {
        CAP.with(Cell::get)
    }

    /// Runs `f` with every kernel this thread dispatches capped at `path`.
    pub(crate) fn with<R>(path: KernelPath, f: impl FnOnce() -> R) -> R {
        let before = CAP.with(|c| c.replace(path));
        let r = f();
        CAP.with(|c| c.set(before));
        r
    }
}
