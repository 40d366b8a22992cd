//! One grammar for the CLI's durations and sizes: a number with a unit, or a bare number in the
//! flag's own unit (seconds for durations, bytes for sizes), so `--duration 10`, `10s`,
//! `500ms` and `2m` all mean what they say, and `--tail-cache-bytes 64MiB` is 64 × 2^20.

use std::time::Duration;

/// `30s`, `500ms`, `2m`, `1h`, or a bare number of seconds (`10`, `0.5`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (value, unit) = split_number(text, "a duration like 30s, 500ms or 2m")?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (ms, s, m or h; a bare number is seconds)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?}: out of range"))
}

/// `64MiB`, `1GB`, `512KiB`, `4096B`, or a bare number of bytes. KB, MB, GB and TB are powers
/// of 1000; KiB, MiB, GiB and TiB of 1024.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (value, unit) = split_number(text, "a size like 64MiB, 1GB or 4096")?;
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ));
        }
    };
    let bytes = value * scale as f64;
    if bytes.fract() != 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?}: not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// [`parse_bytes`] for a flag held as `usize`.
pub fn parse_bytes_usize(text: &str) -> Result<usize, String> {
    let bytes = parse_bytes(text)?;
    usize::try_from(bytes).map_err(|_| format!("{text:?}: too large"))
}

/// [`parse_bytes`] for a flag held as `u32`.
pub fn parse_bytes_u32(text: &str) -> Result<u32, String> {
    let bytes = parse_bytes(text)?;
    u32::try_from(bytes).map_err(|_| format!("{text:?}: over 4 GiB"))
}

/// A non-negative number and the unit written after it.
fn split_number<'a>(text: &'a str, expected: &str) -> Result<(f64, &'a str), String> {
    let trimmed = text.trim();
    let at = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(at);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected {expected}"))?;
    Ok((value, unit.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_bare_seconds() {
        let ms = |ms| Duration::from_millis(ms);
        for (text, expected) in [
            ("10", ms(10_000)),
            ("10s", ms(10_000)),
            ("0.5", ms(500)),
            ("500ms", ms(500)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            (" 30s ", ms(30_000)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
        for text in ["", "s", "10x", "-1s", "1e9999"] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }

    #[test]
    fn sizes_take_decimal_and_binary_units_and_bare_bytes() {
        for (text, expected) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("64MiB", 64 << 20),
            ("1GB", 1_000_000_000),
            ("1.5KiB", 1536),
            ("2 GiB", 2 << 30),
        ] {
            assert_eq!(parse_bytes(text), Ok(expected), "{text}");
        }
        for text in ["", "MiB", "1.5", "10XB", "-5", "0.1B"] {
            assert!(parse_bytes(text).is_err(), "{text}");
        }
        assert!(parse_bytes_u32("5GiB").is_err());
        assert_eq!(parse_bytes_u32("4MiB"), Ok(4 << 20));
    }
}

/// A duration in the config file: a string in [`parse_duration`]'s grammar (`"1h"`), or a
/// number of seconds.
pub mod serde_duration_option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Text(String),
        Seconds(f64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Duration>, D::Error> {
        let written = Option::<Written>::deserialize(deserializer)?;
        written
            .map(|written| match written {
                Written::Text(text) => super::parse_duration(&text),
                Written::Seconds(seconds) => Duration::try_from_secs_f64(seconds)
                    .map_err(|_| format!("{seconds}: out of range")),
            })
            .transpose()
            .map_err(serde::de::Error::custom)
    }
}
