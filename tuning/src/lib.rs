//! Host checks and disk-aware tuning (`strata tune`, `strata iotune`). Arrives with the tuning issue.
