//! `sluice simulate fit`: a step-time profile fitted to one or more
//! `sluice serve --step-log` files, and the fit's report on stdout.

use super::*;

pub(super) fn run_fit(args: &FitArgs) -> Result<()> {
    let file = args
        .step_log
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut records = Vec::new();
    for path in &args.step_log {
        records
            .extend(sluice_sim::fit::read_step_log(path).map_err(|e| bad_config(e.to_string()))?);
    }
    let report = sluice_sim::fit(&records, &sluice_sim::FitOptions::default())
        .map_err(|e| bad_config(format!("{file}: {e}")))?;
    let mut fitted = FittedProfile::from_report(&report, file.clone());
    fitted.name = args.name.clone();
    fitted.fitted_range = StepRange::of(&records);
    Profile::Fitted(fitted)
        .save(&args.output)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "fitted {} steps of {file} ({} held out, {} skipped)",
        report.train_steps, report.held_out_steps, report.skipped_steps
    );
    for c in &report.candidates {
        println!(
            "  {:<24} validation MAPE {:>6.2}%",
            format!("{:?}", c.segmentation),
            c.validation_mape_pct
        );
    }
    println!(
        "chosen: {:?}, {} piece(s)",
        report.model.segmentation,
        report.model.pieces.len()
    );
    println!(
        "held-out error: MAPE {:.2}%, median {:.2}%, p90 {:.2}%{}",
        report.held_out_mape_pct,
        report.held_out_median_ape_pct,
        report.held_out_p90_ape_pct,
        report
            .held_out_r2
            .map_or(String::new(), |r2| format!(", R² {r2:.4}"))
    );
    println!("wrote {}", args.output.display());
    Ok(())
}
