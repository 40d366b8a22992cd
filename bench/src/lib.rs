//! The load tool behind `strata bench`. Arrives with the bench issue.
