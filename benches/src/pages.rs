//! Database-like 8 KiB pages, deterministic (a fixed xorshift seed):
//! what an OLTP table's heap pages look like to a WAN compressor.
//!
//! Each page: a 24-byte header (page number, LSN, checksum, free-space
//! pointers), a line-pointer array, and rows growing down from the end —
//! an id, a customer number, an amount, a status word from a small set, a
//! timestamp close to the previous one, a name and a city drawn from short
//! lists, a free-text note — filled to about 70 % with the rest zero, as
//! a page with a fill factor leaves it. Nothing here is tuned to any
//! compressor; it is the redundancy real tables have (repeated
//! vocabulary, small integers, monotonic keys, free space).

/// Page size.
pub const PAGE: usize = 8192;

const NAMES: &[&str] = &[
    "Anderson", "Baker", "Chen", "Dubois", "Evans", "Fischer", "Garcia", "Hansen", "Ivanov",
    "Jones", "Kowalski", "Larsen", "Martin", "Nakamura", "Olsen", "Petrov", "Quinn", "Rossi",
    "Schmidt", "Tanaka", "Urban", "Virtanen", "Weber", "Yilmaz", "Zhang",
];
const CITIES: &[&str] = &[
    "Amsterdam",
    "Berlin",
    "Chicago",
    "Dublin",
    "Lisbon",
    "Madrid",
    "Oslo",
    "Paris",
    "Prague",
    "Rome",
    "Seoul",
    "Tokyo",
    "Vienna",
    "Warsaw",
    "Zurich",
];
const STATUS: &[&str] = &["NEW", "PAID", "SHIPPED", "RETURNED", "CANCELLED"];
const WORDS: &[&str] = &[
    "order",
    "delivered",
    "customer",
    "requested",
    "invoice",
    "priority",
    "standard",
    "express",
    "gift",
    "wrap",
    "call",
    "before",
    "delivery",
    "door",
    "code",
    "left",
    "with",
    "neighbour",
];

/// The generator.
#[derive(Debug, Clone)]
pub struct Pages {
    state: u64,
    page_no: u32,
    row_id: u64,
    lsn: u64,
    ts: u64,
}

impl Default for Pages {
    fn default() -> Pages {
        Pages::new()
    }
}

impl Pages {
    /// The fixed sequence.
    pub fn new() -> Pages {
        Pages {
            state: 0x2545_f491_4f6c_dd1d,
            page_no: 0,
            row_id: 1_000_000,
            lsn: 0x0001_0000_0000,
            ts: 1_700_000_000_000,
        }
    }

    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[(self.next() % list.len() as u64) as usize]
    }

    /// Fills `out` (a multiple of 8 KiB) with pages.
    pub fn fill(&mut self, out: &mut [u8]) {
        for page in out.chunks_mut(PAGE) {
            self.page(page);
        }
    }

    /// One page into `p` (8 KiB).
    pub fn page(&mut self, p: &mut [u8]) {
        p.fill(0);
        self.page_no += 1;
        self.lsn += 1 + self.next() % 64;
        p[0..8].copy_from_slice(&self.lsn.to_le_bytes());
        p[12..16].copy_from_slice(&self.page_no.to_le_bytes());
        let mut lower = 24usize;
        let mut upper = p.len();
        let target = p.len() * 30 / 100; // ~70 % full
        while upper - lower > target {
            let mut row = Vec::with_capacity(160);
            self.row_id += 1;
            self.ts += self.next() % 5000;
            row.extend_from_slice(&self.row_id.to_le_bytes());
            row.extend_from_slice(&((self.next() % 50_000) as u32).to_le_bytes());
            row.extend_from_slice(&((self.next() % 100_000) as u32).to_le_bytes());
            row.extend_from_slice(&self.ts.to_le_bytes());
            for s in [self.pick(STATUS), self.pick(NAMES), self.pick(CITIES)] {
                row.push(s.len() as u8);
                row.extend_from_slice(s.as_bytes());
            }
            let words = 3 + self.next() % 8;
            let mut note = String::new();
            for _ in 0..words {
                note.push_str(self.pick(WORDS));
                note.push(' ');
            }
            row.push(note.len() as u8);
            row.extend_from_slice(note.as_bytes());
            while row.len() % 8 != 0 {
                row.push(0);
            }
            if upper < row.len() + lower + 4 {
                break;
            }
            upper -= row.len();
            p[upper..upper + row.len()].copy_from_slice(&row);
            p[lower..lower + 2].copy_from_slice(&(upper as u16).to_le_bytes());
            p[lower + 2..lower + 4].copy_from_slice(&(row.len() as u16).to_le_bytes());
            lower += 4;
        }
        p[16..18].copy_from_slice(&(lower as u16).to_le_bytes());
        p[18..20].copy_from_slice(&(upper as u16).to_le_bytes());
        let sum = p
            .iter()
            .fold(0u16, |a, b| a.wrapping_mul(31).wrapping_add(u16::from(*b)));
        p[8..10].copy_from_slice(&sum.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_page_shaped() {
        let mut a = vec![0u8; 4 * PAGE];
        let mut b = vec![0u8; 4 * PAGE];
        Pages::new().fill(&mut a);
        Pages::new().fill(&mut b);
        assert_eq!(a, b);
        let zeros = a.iter().filter(|x| **x == 0).count();
        assert!(zeros > a.len() / 5 && zeros < a.len() / 2, "{zeros}");
        assert_ne!(a[..PAGE], a[PAGE..2 * PAGE]);
    }
}
