//! Room on one link, shared by the N_Ports on it: the frames an
//! initiator's open commands may bring back ([`NPortConfig::max_frames_in`])
//! and the write data a target's admitted writes may still receive
//! ([`NPortConfig::max_write_in_flight`]).
//!
//! A link that cannot pause its sender (FCoE without PFC) loses what
//! arrives while its receive ring is full, so the bound belongs to the
//! link, not to a port: with one NPIV port per front-end host, several
//! hosts reading deep through one ENode would otherwise pass it together,
//! and so would several target ports behind one FCF. An N_Port made with
//! a bound creates a [`LinkBudget`] and keeps it in its configuration
//! (unless the configuration already carries one with the same bound); a
//! port made from a clone of that configuration (an NPIV port on the same
//! link) counts against the same budget.
//!
//! Room is given in order across the link: a command that has to wait
//! takes a [`Ticket`], and no command starts while an older ticket waits,
//! on any port. One command alone on the link always goes, however much
//! it brings.
//!
//! Both what a command holds ([`Room`]) and its place in line ([`Ticket`])
//! are given back when they are dropped, so a command that ends any way at
//! all (answered, timed out, aborted, its port gone) cannot leak room and
//! stall the link.
//!
//! [`NPortConfig::max_frames_in`]: super::NPortConfig::max_frames_in
//! [`NPortConfig::max_write_in_flight`]: super::NPortConfig::max_write_in_flight

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Room on one link (frames or bytes: the unit is its user's); clones
/// share it.
#[derive(Clone)]
pub struct LinkBudget {
    max: u64,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Bumped (under the lock) whenever room is given back or the oldest
    /// waiter leaves: ports with commands waiting look again. Read
    /// without the lock, after every frame while commands wait.
    freed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Room the link's open commands hold.
    used: u64,
    /// Tickets of commands waiting for room, oldest first.
    waiting: BTreeSet<u64>,
    next_ticket: u64,
}

impl fmt::Debug for LinkBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("LinkBudget")
            .field("max", &self.max)
            .field("used", &s.used)
            .field("waiting", &s.waiting.len())
            .finish()
    }
}

impl LinkBudget {
    /// A budget of `max`, nothing in use.
    pub fn new(max: u64) -> LinkBudget {
        LinkBudget {
            max,
            shared: Arc::new(Shared::default()),
        }
    }

    /// The bound.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Room the link's open commands hold (above [`LinkBudget::max`]
    /// only while one command alone passes it).
    pub fn in_use(&self) -> u64 {
        self.lock().used
    }

    /// Commands on the link waiting for room.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Whether `other` is this budget (the same link).
    pub fn same(&self, other: &LinkBudget) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Room for a command that needs `amount`, if it may start now: no
    /// older ticket waits (`ticket` is the command's own, if it has one)
    /// and the amount fits, or nothing at all is held on the link.
    pub fn take(&self, amount: u64, ticket: Option<&Ticket>) -> Option<Room> {
        let mut s = self.lock();
        let first = s.waiting.first().copied();
        let my_turn = first.is_none() || first == ticket.map(|t| t.number);
        let fits = s.used == 0 || s.used.saturating_add(amount) <= self.max;
        if !(my_turn && fits) {
            return None;
        }
        s.used = s.used.saturating_add(amount);
        Some(Room {
            budget: self.clone(),
            held: amount,
        })
    }

    /// A place in line for a command that has to wait.
    pub fn ticket(&self) -> Ticket {
        let mut s = self.lock();
        let number = s.next_ticket;
        s.next_ticket += 1;
        s.waiting.insert(number);
        Ticket {
            budget: self.clone(),
            number,
        }
    }

    /// Changes whenever room is given back or a waiting command leaves
    /// the line: a port with commands waiting compares it with the value
    /// it saw last.
    pub fn freed(&self) -> u64 {
        self.shared.freed.load(Ordering::Acquire)
    }

    /// Tells the ports to look again; called with the lock held, so the
    /// change is visible by the time a reader of the new value locks.
    fn bump_freed(&self) {
        self.shared.freed.fetch_add(1, Ordering::Release);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing under the lock can panic; a poisoned lock still holds
        // consistent counts.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Room a started command holds; given back when dropped.
#[derive(Debug)]
pub struct Room {
    budget: LinkBudget,
    held: u64,
}

impl Room {
    /// The room still held.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Gives back part of the room (data that has come in), at most all
    /// of it.
    pub fn give_back(&mut self, amount: u64) {
        let amount = amount.min(self.held);
        if amount == 0 {
            return;
        }
        self.held -= amount;
        let mut s = self.budget.lock();
        s.used = s.used.saturating_sub(amount);
        self.budget.bump_freed();
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        self.give_back(self.held);
    }
}

/// A waiting command's place in line; leaves the line when dropped.
#[derive(Debug)]
pub struct Ticket {
    budget: LinkBudget,
    number: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.budget.lock();
        // The oldest waiter leaving can let the next one go.
        if s.waiting.first() == Some(&self.number) {
            self.budget.bump_freed();
        }
        s.waiting.remove(&self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_given_in_order_and_back_when_dropped() {
        let b = LinkBudget::new(1000);
        let a = b.take(600, None).expect("room on an empty link");
        assert_eq!(b.in_use(), 600);
        // 600 + 600 > 1000: waits, with a ticket.
        assert!(b.take(600, None).is_none());
        let t1 = b.ticket();
        // A small command without a ticket may not overtake the waiter.
        assert!(b.take(10, None).is_none());
        let t2 = b.ticket();
        assert!(b.take(10, Some(&t2)).is_none(), "t1 is older");
        let f0 = b.freed();
        drop(a);
        assert_ne!(b.freed(), f0);
        assert_eq!(b.in_use(), 0);
        let r1 = b.take(600, Some(&t1)).expect("t1's turn");
        drop(t1);
        let r2 = b.take(10, Some(&t2)).expect("t2's turn, and it fits");
        drop(t2);
        assert_eq!(b.in_use(), 610);
        assert_eq!(b.waiting(), 0);
        drop((r1, r2));
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn one_command_alone_always_goes() {
        let b = LinkBudget::new(513);
        let r = b.take(5000, None).expect("alone on the link");
        assert_eq!(r.held(), 5000);
        assert!(b.take(1, None).is_none());
        drop(r);
        assert!(b.take(1, None).is_some());
    }

    #[test]
    fn a_waiter_that_leaves_lets_the_next_go() {
        let b = LinkBudget::new(100);
        let held = b.take(90, None).expect("room");
        let t1 = b.ticket();
        let t2 = b.ticket();
        assert!(b.take(5, Some(&t2)).is_none(), "behind t1");
        let f0 = b.freed();
        drop(t1); // timed out, say
        assert_ne!(b.freed(), f0, "the ports are told to look again");
        assert!(b.take(5, Some(&t2)).is_some());
        drop(held);
    }

    #[test]
    fn room_is_given_back_in_parts() {
        let b = LinkBudget::new(100);
        let mut r = b.take(80, None).expect("room");
        let t = b.ticket();
        assert!(b.take(50, Some(&t)).is_none());
        let f0 = b.freed();
        r.give_back(40);
        assert_ne!(b.freed(), f0);
        assert_eq!((r.held(), b.in_use()), (40, 40));
        let r2 = b.take(50, Some(&t)).expect("90 fits in 100");
        drop(t);
        r.give_back(1000);
        assert_eq!((r.held(), b.in_use()), (0, 50));
        drop(r);
        assert_eq!(b.in_use(), 50, "nothing given back twice");
        drop(r2);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn clones_share_the_budget() {
        let b = LinkBudget::new(100);
        let c = b.clone();
        assert!(b.same(&c));
        assert!(!b.same(&LinkBudget::new(100)));
        let _r = c.take(80, None).expect("room");
        assert_eq!(b.in_use(), 80);
        assert!(b.take(30, None).is_none());
    }
}
