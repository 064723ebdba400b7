//! The one dispatch: `SLUICE_KERNEL` and `set_kernel_path` cap every kernel
//! family (matmul of every format, attention, elementwise), each lowered
//! only to what this CPU runs; the elementwise helpers give the same bits
//! on every path. Its own test binary, because the setting is process-wide.

use sluice_model::kernels::{
    cpu_features, dot, kernel_path, matmul, rms_norm, set_kernel_path, softmax_in_place,
    KernelFamily, KernelPath, QuantFormat, WeightRef,
};
use std::process::Command;
use std::sync::Mutex;

/// The tests below change the process-wide setting one at a time.
static SETTING: Mutex<()> = Mutex::new(());

#[test]
fn set_kernel_path_caps_every_family() {
    let _one = SETTING.lock().unwrap_or_else(|e| e.into_inner());
    let cpu = cpu_features();
    for want in KernelPath::ALL {
        set_kernel_path(Some(want));
        for f in KernelFamily::ALL {
            let got = kernel_path(f);
            assert!(got <= want, "{f:?}: {got} above the request {want}");
            assert_eq!(got, cpu.clamp(f, want), "{f:?}");
            assert!(
                cpu.supports(f, got),
                "{f:?} on {got}: an illegal instruction"
            );
        }
    }
    set_kernel_path(Some(KernelPath::Portable));
    assert!(KernelFamily::ALL
        .iter()
        .all(|&f| kernel_path(f) == KernelPath::Portable));
    set_kernel_path(None);
    for f in KernelFamily::ALL {
        assert_eq!(kernel_path(f), cpu.best(f), "{f:?}");
    }
    eprintln!("{cpu}");
}

#[test]
fn elementwise_helpers_give_the_same_bits_on_every_path() {
    let _one = SETTING.lock().unwrap_or_else(|e| e.into_inner());
    let x: Vec<f32> = (0..1000)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let w: Vec<f32> = (0..100).map(|i| 1.0 + i as f32 / 100.0).collect();
    let run = || {
        let d = dot(&x, &x[..].iter().rev().copied().collect::<Vec<_>>());
        let mut n = vec![0.0; 1000];
        rms_norm(&x, &w, 1e-6, &mut n);
        let mut s = x[..64].to_vec();
        softmax_in_place(&mut s);
        (
            d.to_bits(),
            n.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            s,
        )
    };
    set_kernel_path(Some(KernelPath::Portable));
    let base = run();
    for p in [KernelPath::Avx2, KernelPath::Avx512] {
        set_kernel_path(Some(p));
        let got = run();
        assert_eq!(got.0, base.0, "dot on {p}");
        assert_eq!(got.1, base.1, "rms_norm on {p}");
        assert!(
            got.2
                .iter()
                .zip(&base.2)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "softmax on {p}"
        );
    }
    set_kernel_path(None);
}

/// Run as a child with `SLUICE_KERNEL` set (see below): every family
/// reports the environment's cap, and a quantized matmul runs on it.
#[test]
fn child_reports_the_environment_cap() {
    let Ok(want) = std::env::var("SLUICE_DISPATCH_CHILD") else {
        return;
    };
    let want = KernelPath::parse(&want)
        .expect("a path name")
        .expect("not auto");
    let cpu = cpu_features();
    for f in KernelFamily::ALL {
        assert_eq!(kernel_path(f), cpu.clamp(f, want), "{f:?}");
    }
    let w = QuantFormat::Q8_0
        .quantize(&[0.5; 64], 32)
        .expect("quantizes");
    let mut out = [0.0f32; 2];
    matmul(
        &[1.0; 32],
        1,
        32,
        WeightRef::Quant {
            format: QuantFormat::Q8_0,
            data: &w,
        },
        2,
        &mut out,
    );
    assert!((out[0] - 16.0).abs() < 0.1, "{out:?}");
}

#[test]
fn sluice_kernel_env_caps_every_family_in_a_new_process() {
    let exe = std::env::current_exe().expect("test binary");
    for name in ["portable", "avx2", "avx512"] {
        let status = Command::new(&exe)
            .args([
                "--exact",
                "child_reports_the_environment_cap",
                "--nocapture",
            ])
            .env("SLUICE_KERNEL", name)
            .env("SLUICE_DISPATCH_CHILD", name)
            .status()
            .expect("runs the child");
        assert!(status.success(), "SLUICE_KERNEL={name}: child failed");
    }
}
