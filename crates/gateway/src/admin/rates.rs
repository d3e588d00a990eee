//! Load rates in the style of NX-OS `show interface`: each interface's
//! counters are sampled at a steady interval, and the rate over a window
//! (1 and 5 minutes by default, `[admin] load_interval`) is the counter's
//! growth from the oldest sample inside the window to the newest, per
//! second. Time is passed in ([`Rates::observe`] takes `now`), so that the
//! arithmetic is tested with exact values.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// One counter's samples, oldest first.
type Series = VecDeque<(Duration, u64)>;

/// Sampled counters of every interface.
#[derive(Debug, Clone)]
pub struct Rates {
    windows: Vec<Duration>,
    /// (interface, counter) -> samples.
    series: BTreeMap<(String, &'static str), Series>,
}

impl Rates {
    /// Rates over `windows` (each > 0), kept shortest first.
    pub fn new(mut windows: Vec<Duration>) -> Rates {
        windows.sort();
        windows.dedup();
        Rates {
            windows,
            series: BTreeMap::new(),
        }
    }

    /// The windows.
    pub fn windows(&self) -> &[Duration] {
        &self.windows
    }

    /// Records `value` of `counter` on `interface` at `now`, and forgets
    /// samples older than the longest window needs.
    pub fn observe(&mut self, now: Duration, interface: &str, counter: &'static str, value: u64) {
        let keep = self.windows.iter().copied().max().unwrap_or_default();
        let s = self
            .series
            .entry((interface.to_string(), counter))
            .or_default();
        s.push_back((now, value));
        // Keep the newest sample at or before `now - keep`: the base of
        // the longest window.
        while s.len() > 2
            && s.get(1)
                .is_some_and(|(t, _)| now.saturating_sub(*t) >= keep)
        {
            s.pop_front();
        }
    }

    /// Forgets interfaces not in `live` (gone since the last sample).
    pub fn retain(&mut self, live: &[String]) {
        self.series.retain(|(i, _), _| live.contains(i));
    }

    /// The rate of `counter` on `interface` over `window`, per second: the
    /// growth from the oldest sample no older than `window` before the
    /// newest (or the oldest sample there is) to the newest. `None` with
    /// fewer than two samples. A counter that went down (the interface
    /// was recreated) counts from zero.
    pub fn rate(&self, interface: &str, counter: &'static str, window: Duration) -> Option<f64> {
        let s = self.series.get(&(interface.to_string(), counter))?;
        let &(t1, v1) = s.back()?;
        let &(t0, v0) = s.iter().find(|(t, _)| t1.saturating_sub(*t) <= window)?;
        if t1 <= t0 {
            return None;
        }
        let grown = if v1 >= v0 { v1 - v0 } else { v1 };
        Some(grown as f64 / (t1 - t0).as_secs_f64())
    }
}

/// A window as NX-OS writes it: `30s`, `1m`, `5m`.
pub fn window_name(w: Duration) -> String {
    let s = w.as_secs();
    if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn rates_over_each_window_are_exact() {
        let mut r = Rates::new(vec![S(60), S(300)]);
        assert_eq!(r.rate("fc1", "rx_bytes", S(60)), None);
        // 1,000 bytes a second for 10 minutes, sampled every 10 s.
        for i in 0..=60 {
            r.observe(S(i * 10), "fc1", "rx_bytes", i * 10_000);
        }
        assert_eq!(r.rate("fc1", "rx_bytes", S(60)), Some(1_000.0));
        assert_eq!(r.rate("fc1", "rx_bytes", S(300)), Some(1_000.0));
        // Then 30 s at 4,000 a second: the 1-minute rate is the mean of
        // the last minute, (30 × 1,000 + 30 × 4,000) / 60; the 5-minute
        // one, (270 × 1,000 + 30 × 4,000) / 300.
        let mut v = 600_000;
        for i in 61..=63 {
            v += 40_000;
            r.observe(S(i * 10), "fc1", "rx_bytes", v);
        }
        assert_eq!(r.rate("fc1", "rx_bytes", S(60)), Some(2_500.0));
        assert_eq!(r.rate("fc1", "rx_bytes", S(300)), Some(1_300.0));
        // Idle for a minute: the 1-minute rate falls to zero, the
        // 5-minute one does not yet: (210 × 1,000 + 30 × 4,000) / 300.
        for i in 64..=69 {
            r.observe(S(i * 10), "fc1", "rx_bytes", v);
        }
        assert_eq!(r.rate("fc1", "rx_bytes", S(60)), Some(0.0));
        assert_eq!(r.rate("fc1", "rx_bytes", S(300)), Some(1_100.0));
    }

    #[test]
    fn a_young_interface_uses_what_it_has_and_old_samples_go() {
        let mut r = Rates::new(vec![S(60)]);
        r.observe(S(0), "p", "frames", 0);
        r.observe(S(20), "p", "frames", 50);
        assert_eq!(r.rate("p", "frames", S(60)), Some(2.5));
        for i in 3..100 {
            r.observe(S(i * 10), "p", "frames", 50);
        }
        let kept = r.series.values().next().map(VecDeque::len);
        assert!(kept.is_some_and(|n| n <= 8), "{kept:?} samples kept");
        // Recreated: the counter restarts.
        r.observe(S(1000), "p", "frames", 30);
        assert_eq!(r.rate("p", "frames", S(60)), Some(0.5));
        r.retain(&[]);
        assert_eq!(r.rate("p", "frames", S(60)), None);
    }

    #[test]
    fn windows_are_named_as_nx_os_does() {
        assert_eq!(window_name(S(60)), "1m");
        assert_eq!(window_name(S(300)), "5m");
        assert_eq!(window_name(S(30)), "30s");
    }
}
