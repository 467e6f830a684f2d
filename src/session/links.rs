//! The session's upstream links by role. An [`Epoch`] names one link for its whole life;
//! a link changes role only through the moves here (a new standby, the switch of a
//! migration, a promotion), so no two roles ever hold the same link.
//!
//! ```text
//!   new_standby ─► standby ─ promote (start-up, failover) ──────────► primary
//!                     └──── switch (migration): primary ─► retiring, standby ─► primary
//!   take(role): the link leaves its role (lost, closed, retired)
//! ```

use std::time::Instant;

use super::action::Epoch;
use super::link::Link;

/// What a link is to the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Carries the client's traffic.
    Primary,
    /// Being brought up (dial → INFO → CONNECT+PING → SUB replay → PING).
    Standby,
    /// The old primary after a switch, until it has been drained.
    Retiring,
}

impl Role {
    pub(super) const ALL: [Role; 3] = [Role::Primary, Role::Standby, Role::Retiring];
}

/// Up to one link per role, and the epoch counter.
#[derive(Default)]
pub(super) struct Links {
    primary: Option<Link>,
    standby: Option<Link>,
    retiring: Option<Link>,
    /// The last epoch given out.
    epoch: u64,
}

impl Links {
    pub(super) fn get(&self, role: Role) -> Option<&Link> {
        match role {
            Role::Primary => self.primary.as_ref(),
            Role::Standby => self.standby.as_ref(),
            Role::Retiring => self.retiring.as_ref(),
        }
    }

    pub(super) fn get_mut(&mut self, role: Role) -> Option<&mut Link> {
        match role {
            Role::Primary => self.primary.as_mut(),
            Role::Standby => self.standby.as_mut(),
            Role::Retiring => self.retiring.as_mut(),
        }
    }

    pub(super) fn primary(&self) -> Option<&Link> {
        self.primary.as_ref()
    }

    pub(super) fn primary_mut(&mut self) -> Option<&mut Link> {
        self.primary.as_mut()
    }

    pub(super) fn standby(&self) -> Option<&Link> {
        self.standby.as_ref()
    }

    /// The role of the link of `epoch`; `None` for an epoch no role holds (its events
    /// are dropped).
    pub(super) fn role_of(&self, epoch: Epoch) -> Option<Role> {
        Role::ALL
            .into_iter()
            .find(|&r| self.get(r).is_some_and(|l| l.epoch == epoch))
    }

    /// The link of `role` leaves it.
    pub(super) fn take(&mut self, role: Role) -> Option<Link> {
        match role {
            Role::Primary => self.primary.take(),
            Role::Standby => self.standby.take(),
            Role::Retiring => self.retiring.take(),
        }
    }

    /// Every link leaves its role (the session closes).
    pub(super) fn take_all(&mut self) -> [Option<Link>; 3] {
        Role::ALL.map(|r| self.take(r))
    }

    /// A new link to `addr`, being dialled, as the standby (replacing none: the caller
    /// has taken the old standby). Its epoch is new.
    pub(super) fn new_standby(&mut self, addr: String, now: Instant) -> Epoch {
        debug_assert!(
            self.standby.is_none(),
            "a standby is replaced only once taken"
        );
        self.epoch += 1;
        let epoch = Epoch(self.epoch);
        self.standby = Some(Link::new(epoch, addr, now));
        epoch
    }

    /// A migration's switch: the primary retires, the standby carries the traffic.
    pub(super) fn switch(&mut self) {
        debug_assert!(self.retiring.is_none(), "one migration retires one link");
        self.retiring = self.primary.take();
        self.primary = self.standby.take();
    }

    /// The standby carries the traffic, where no primary does (start-up, failover).
    pub(super) fn promote(&mut self) {
        debug_assert!(
            self.primary.is_none(),
            "a primary is replaced only once lost"
        );
        self.primary = self.standby.take();
    }
}
