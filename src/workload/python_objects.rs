//! The Python-serving-like workload (CPU allocator literature): many small objects of a few size
//! classes. Each iteration allocates `per_iteration` objects of sizes drawn from `sizes`, keeps
//! `keep` of them (the rest die at the end of the iteration), and once the kept set passes
//! `trim_above` it is trimmed to the `trim_to` most recent. The kept set is live at the end.

use std::collections::VecDeque;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::model::Emitter;
use super::spec::PythonObjectsSpec;
use crate::event::Event;

pub struct PythonObjectsGen {
    spec: PythonObjectsSpec,
    rng: ChaCha8Rng,
    e: Emitter,
    kept: VecDeque<u64>,
    iteration: u64,
}

impl PythonObjectsGen {
    pub fn new(spec: &PythonObjectsSpec, seed: u64) -> Self {
        PythonObjectsGen { spec: spec.clone(), rng: ChaCha8Rng::seed_from_u64(seed), e: Emitter::default(), kept: VecDeque::new(), iteration: 0 }
    }

    fn iterate(&mut self) {
        self.iteration += 1;
        self.e.step(self.iteration);
        let mut fresh = Vec::with_capacity(self.spec.per_iteration as usize);
        for _ in 0..self.spec.per_iteration {
            let size = self.spec.sizes[self.rng.random_range(0..self.spec.sizes.len())].0;
            fresh.push(self.e.alloc(size));
        }
        let keep = self.spec.keep.min(self.spec.per_iteration) as usize;
        for (i, id) in fresh.into_iter().enumerate() {
            if i < keep {
                self.kept.push_back(id);
            } else {
                self.e.free(id);
            }
        }
        if self.kept.len() as u64 > self.spec.trim_above {
            while self.kept.len() as u64 > self.spec.trim_to {
                let old = self.kept.pop_front().expect("non-empty");
                self.e.free(old);
            }
        }
    }
}

impl Iterator for PythonObjectsGen {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.e.pop() {
                return Some(ev);
            }
            if self.iteration >= self.spec.iterations {
                return None;
            }
            self.iterate();
        }
    }
}
