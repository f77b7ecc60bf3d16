//! Explicit event lists: the small textbook cases from the fragmentation literature.

use super::spec::{ScenarioEvent, ScenarioSpec};
use crate::event::Event;

pub fn events(spec: &ScenarioSpec) -> impl Iterator<Item = Event> + '_ {
    spec.events.iter().map(|e| match *e {
        ScenarioEvent::Alloc { id, bytes, stream } => Event::Alloc { id, bytes: bytes.0, stream },
        ScenarioEvent::Free { id } => Event::Free { id },
        ScenarioEvent::EmptyCache {} => Event::EmptyCache,
        ScenarioEvent::Step { n } => Event::Step { n },
    })
}
