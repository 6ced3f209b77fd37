//! Standard five-field cron schedules (UTC) for disruption budgets: parse, validate, and ask
//! whether a budget window is active.
//!
//! Syntax: `minute hour day-of-month month day-of-week`, each a comma list of `*`, `?`, `n`,
//! `a-b`, with an optional `/step`; month and weekday accept names (JAN, MON); or one of the
//! macros @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly. When both
//! day-of-month and day-of-week are restricted, a day matching either fires (classic cron).

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cron schedule {schedule:?}: {reason}")]
pub struct Error {
    pub schedule: String,
    pub reason: String,
}

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    dom_restricted: bool,
    dow_restricted: bool,
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &MONTHS,
    },
    Field {
        name: "day of week",
        min: 0,
        max: 6,
        names: &WEEKDAYS,
    },
];

/// Parses a schedule; the error says which field is wrong and why.
pub fn parse(schedule: &str) -> Result<CronSchedule, Error> {
    let fail = |reason: String| Error {
        schedule: schedule.to_string(),
        reason,
    };
    let expanded = match schedule.trim() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other if other.starts_with('@') => {
            return Err(fail(format!(
                "unknown macro {other:?} (use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"
            )));
        }
        other => other,
    };
    let parts: Vec<&str> = expanded.split_whitespace().collect();
    if parts.len() != 5 {
        return Err(fail(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week), got {}",
            parts.len()
        )));
    }
    let mut bits = [0u64; 5];
    for ((text, field), out) in parts.iter().zip(FIELDS.iter()).zip(bits.iter_mut()) {
        *out = parse_field(text, field)
            .map_err(|e| fail(format!("{} field {text:?}: {e}", field.name)))?;
    }
    let restricted = |t: &str| t != "*" && t != "?";
    Ok(CronSchedule {
        minutes: bits[0],
        hours: bits[1],
        days_of_month: bits[2],
        months: bits[3],
        days_of_week: bits[4],
        dom_restricted: restricted(parts[2]),
        dow_restricted: restricted(parts[4]),
    })
}

fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .map_err(|_| format!("step {s:?} is not a number"))?;
                if step == 0 {
                    return Err("step must be at least 1".to_string());
                }
                (r, step)
            }
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            (field.min, field.max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, field)?, value(b, field)?)
        } else {
            let v = value(range, field)?;
            // "5/15" means from 5 to the end in steps of 15.
            (v, if item.contains('/') { field.max } else { v })
        };
        if lo > hi {
            return Err(format!("range {lo}-{hi} is backwards"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

fn value(text: &str, field: &Field) -> Result<u32, String> {
    if let Some(i) = field
        .names
        .iter()
        .position(|n| n.eq_ignore_ascii_case(text))
    {
        // Month names count from 1, weekday names from 0.
        return Ok(i as u32 + field.min);
    }
    let v: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number or name"))?;
    if v < field.min || v > field.max {
        return Err(format!("{v} is outside {}-{}", field.min, field.max));
    }
    Ok(v)
}

impl CronSchedule {
    /// Whether the schedule fires at this UTC minute (seconds are ignored).
    pub fn fires_at(&self, unix_seconds: i64) -> bool {
        let civil = Civil::from_unix(unix_seconds);
        let bit = |mask: u64, v: u32| mask & (1 << v) != 0;
        if !bit(self.minutes, civil.minute) || !bit(self.hours, civil.hour) {
            return false;
        }
        if !bit(self.months, civil.month) {
            return false;
        }
        self.day_matches(&civil)
    }

    fn day_matches(&self, civil: &Civil) -> bool {
        let dom = self.days_of_month & (1 << civil.day) != 0;
        let dow = self.days_of_week & (1 << civil.weekday) != 0;
        match (self.dom_restricted, self.dow_restricted) {
            (true, true) => dom || dow,
            _ => dom && dow,
        }
    }

    /// The latest firing at or before `now` but not earlier than `now - lookback`, as unix
    /// seconds at the start of that minute. A budget with schedule and duration is active at
    /// `now` when this finds a firing within `duration` (exclusive of the end).
    pub fn last_fire_within(&self, now_unix: i64, lookback: Duration) -> Option<i64> {
        let lookback = i64::try_from(lookback.as_secs()).unwrap_or(i64::MAX);
        let earliest = now_unix.saturating_sub(lookback);
        let mut t = now_unix - now_unix.rem_euclid(60);
        while t >= earliest {
            let civil = Civil::from_unix(t);
            // Skip whole days and hours that cannot match, to keep long lookbacks cheap.
            if self.months & (1 << civil.month) == 0 || !self.day_matches(&civil) {
                t -= i64::from(civil.hour * 3600 + civil.minute * 60) + 60;
                continue;
            }
            if self.hours & (1 << civil.hour) == 0 {
                t -= i64::from(civil.minute * 60) + 60;
                continue;
            }
            if self.minutes & (1 << civil.minute) != 0 {
                return Some(t);
            }
            t -= 60;
        }
        None
    }

    /// Whether a window of `duration` opened by this schedule covers `now`.
    pub fn is_active(&self, now_unix: i64, duration: Duration) -> bool {
        if duration.is_zero() {
            return false;
        }
        // A window that opened exactly `duration` ago has just closed.
        let lookback = duration.saturating_sub(Duration::from_secs(1));
        self.last_fire_within(now_unix, lookback).is_some()
    }
}

/// UTC calendar fields of a unix time.
struct Civil {
    month: u32,
    day: u32,
    weekday: u32,
    hour: u32,
    minute: u32,
}

impl Civil {
    fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Days-to-civil conversion (proleptic Gregorian), after Howard Hinnant's algorithm.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        Civil {
            month,
            day,
            // 1970-01-01 was a Thursday (4).
            weekday: (days + 4).rem_euclid(7) as u32,
            hour: (rem / 3600) as u32,
            minute: ((rem % 3600) / 60) as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2024-03-15T10:30:00Z, a Friday.
    const FRI_1030: i64 = 1_710_498_600;

    #[test]
    fn civil_fields() {
        let c = Civil::from_unix(FRI_1030);
        assert_eq!(
            (c.month, c.day, c.weekday, c.hour, c.minute),
            (3, 15, 5, 10, 30)
        );
        let epoch = Civil::from_unix(0);
        assert_eq!((epoch.month, epoch.day, epoch.weekday), (1, 1, 4));
    }

    #[test]
    fn accepts_valid_schedules() {
        for s in [
            "@hourly",
            "@daily",
            "@midnight",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "* * * * *",
            "0 9 * * 1-5",
            "*/15 * * * *",
            "0 0 1,15 * *",
            "0 22 * * SUN",
            "30 2 * JAN-MAR mon",
            "5/10 * ? * *",
            "0 0 31 12 6",
        ] {
            assert!(parse(s).is_ok(), "{s}: {:?}", parse(s));
        }
    }

    #[test]
    fn rejects_invalid_schedules() {
        let cases = [
            ("", "expected 5 fields"),
            ("* * * *", "got 4"),
            ("* * * * * *", "got 6"),
            ("60 * * * *", "minute field \"60\": 60 is outside 0-59"),
            ("* 24 * * *", "hour field"),
            ("* * 0 * *", "day of month field"),
            ("* * * 13 *", "month field"),
            ("* * * * 7", "day of week field"),
            ("*/0 * * * *", "step must be at least 1"),
            ("5-1 * * * *", "backwards"),
            ("a * * * *", "not a number or name"),
            ("@every 5m", "unknown macro"),
            ("@reboot", "unknown macro"),
        ];
        for (s, want) in cases {
            let err = parse(s).unwrap_err().to_string();
            assert!(err.contains(want), "{s}: {err}");
        }
    }

    #[test]
    fn firing_and_windows() {
        let weekdays_9 = parse("0 9 * * MON-FRI").unwrap();
        let nine = FRI_1030 - 90 * 60;
        assert!(weekdays_9.fires_at(nine));
        assert!(!weekdays_9.fires_at(nine + 60));
        assert!(!weekdays_9.fires_at(nine + 86_400), "Saturday");
        assert_eq!(
            weekdays_9.last_fire_within(FRI_1030, Duration::from_secs(7200)),
            Some(nine)
        );
        assert!(weekdays_9.is_active(FRI_1030, Duration::from_secs(2 * 3600)));
        assert!(!weekdays_9.is_active(FRI_1030, Duration::from_secs(3600)));
        assert!(
            !weekdays_9.is_active(nine + 3600, Duration::from_secs(3600)),
            "end is exclusive"
        );
        assert!(
            weekdays_9.is_active(nine, Duration::from_secs(60)),
            "start is inclusive"
        );
        // Sunday noon: the last firing was Friday 09:00, 51 hours back.
        let sun_noon = nine + 2 * 86_400 + 3 * 3600;
        assert!(weekdays_9.is_active(sun_noon, Duration::from_secs(52 * 3600)));
        assert!(!weekdays_9.is_active(sun_noon, Duration::from_secs(50 * 3600)));
        // Day-of-month OR day-of-week when both are restricted.
        let either = parse("0 0 1 * MON").unwrap();
        let mon_midnight = FRI_1030 + 3 * 86_400 - (10 * 3600 + 30 * 60);
        assert!(either.fires_at(mon_midnight));
    }
}
