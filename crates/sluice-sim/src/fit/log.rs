//! Reading a step log (`sluice serve --step-log`): JSON lines of
//! [`StepRecord`], errors naming the file, the line and the field.

use super::*;

/// Why a step log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StepLogError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file} line {line}: {problem}")]
    Line {
        file: String,
        line: usize,
        problem: String,
    },
}

/// Reads a step log (JSON lines; blank lines skipped).
pub fn read_step_log(path: &Path) -> Result<Vec<StepRecord>, StepLogError> {
    let text = std::fs::read_to_string(path).map_err(|source| StepLogError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_step_log(&text, &path.display().to_string())
}

/// Parses step-log text; `file` is what errors name.
pub fn parse_step_log(text: &str, file: &str) -> Result<Vec<StepRecord>, StepLogError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |problem: String| StepLogError::Line {
            file: file.to_string(),
            line: i + 1,
            problem,
        };
        let mut de = serde_json::Deserializer::from_str(line);
        let rec: StepRecord = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                bad(e.inner().to_string())
            } else {
                bad(format!("field `{path}`: {}", e.inner()))
            }
        })?;
        if rec.rows.len() != rec.num_reqs {
            return Err(bad(format!(
                "field `rows`: {} rows but `num_reqs` is {}",
                rec.rows.len(),
                rec.num_reqs
            )));
        }
        for (field, v) in [("step_s", rec.step_s), ("forward_s", rec.forward_s)] {
            if !v.is_finite() || v < 0.0 {
                return Err(bad(format!(
                    "field `{field}`: {v}, expected a non-negative number of seconds"
                )));
            }
        }
        out.push(rec);
    }
    Ok(out)
}
