//! Where the report goes: text or JSON on standard output, or any format to `--report-out`;
//! the HTML report is always a file (`./simulate-report.html` unless `--report-out` says).

use std::path::{Path, PathBuf};

use super::html;
use super::timeline::Timeline;
use crate::cli::ReportFormat;

/// Where `--report html` writes without `--report-out`.
pub const DEFAULT_HTML_PATH: &str = "simulate-report.html";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Chart(#[from] html::ChartError),
    #[error("writing the report to {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A scenario's report in every form.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub text: String,
    pub json: String,
    pub invariants_ok: bool,
    pub timeline: Timeline,
}

impl Outcome {
    pub fn render(&self, format: ReportFormat) -> Result<String, Error> {
        Ok(match format {
            ReportFormat::Text => self.text.clone(),
            ReportFormat::Json => self.json.clone(),
            ReportFormat::Html => html::render(&self.json, &self.timeline)?,
        })
    }

    /// Print the report, or write it to `out` (HTML: to the default path without one).
    pub fn emit(&self, format: ReportFormat, out: Option<&Path>) -> Result<(), Error> {
        let body = self.render(format)?;
        let path = match (out, format) {
            (Some(p), _) => p.to_path_buf(),
            (None, ReportFormat::Html) => PathBuf::from(DEFAULT_HTML_PATH),
            (None, _) => {
                println!("{body}");
                return Ok(());
            }
        };
        std::fs::write(&path, with_newline(body)).map_err(|source| Error::Write {
            path: path.clone(),
            source,
        })?;
        eprintln!("wrote the report to {}", path.display());
        Ok(())
    }
}

fn with_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}
