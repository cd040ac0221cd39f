//! The name table beside a model's weight ids: per [`WeightId`] the weight's key, role, layer and
//! expert. A [`crate::Manifest`] holds the table of its GGUF ([`crate::Manifest::names`]); a model
//! known by its shape alone (the board clock's published dimensions, its MoE studies) gets one
//! from its roles ([`WeightNames::from_roles`]), named as a GGUF of that shape names them. Every
//! layer keys weights by id; the table is for turning an id into a name (errors, traces, dumps)
//! and a name into an id (the boundary to people and files).

use std::collections::HashMap;

use crate::{weight_key, Role, WeightId};

/// One weight's entry in a [`WeightNames`] table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightName {
    /// Its key: the tensor name, `TENSOR#EXPERT` for an expert's slice ([`crate::Weight::key`]).
    pub key: String,
    /// What it does.
    pub role: Role,
    /// Its block, for per-block weights.
    pub layer: Option<u32>,
    /// The expert, for an expert's slice.
    pub expert: Option<u32>,
}

/// A model's weight names, indexed by [`WeightId`]: the one name table beside the ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightNames {
    names: Vec<WeightName>,
    by_key: HashMap<String, WeightId>,
    by_role: HashMap<(Role, u32, Option<u32>), WeightId>,
}

impl WeightNames {
    /// The table of a model known by its shape alone: one weight per `(role, layer, expert)`,
    /// numbered in the order given, each keyed by the manifest's name table ([`weight_key`]) as a
    /// GGUF of that shape would name it (`blk.3.ffn_up.weight`, `blk.0.ffn_gate_exps.weight#7`,
    /// `output.weight`).
    ///
    /// # Panics
    /// A role that is not a named matmul role (from [`Role::Other`] on), or a weight given twice:
    /// callers give fixed lists of roles.
    pub fn from_roles(
        weights: impl IntoIterator<Item = (Role, Option<u32>, Option<u32>)>,
    ) -> WeightNames {
        let mut names = WeightNames::default();
        for (role, layer, expert) in weights {
            assert!(role < Role::Other, "{role:?} is not a named matmul role");
            let key = weight_key(role, layer.unwrap_or(0) as usize, expert)
                .expect("every role before Other has a name");
            assert!(names.id(&key).is_none(), "weight '{key}' given twice");
            names.push(WeightName {
                key,
                role,
                layer,
                expert,
            });
        }
        names
    }

    /// Append `name` as the next id. A later weight of the same key takes the key; the first of a
    /// (role, layer, expert) keeps it ([`Role::Other`] is not indexed by role).
    pub(crate) fn push(&mut self, name: WeightName) -> WeightId {
        let id = WeightId(u32::try_from(self.names.len()).expect("fewer than 2^32 weights"));
        self.by_key.insert(name.key.clone(), id);
        if name.role != Role::Other {
            self.by_role
                .entry((name.role, name.layer.unwrap_or(u32::MAX), name.expert))
                .or_insert(id);
        }
        self.names.push(name);
        id
    }

    /// Weights in the table.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the table has no weight.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every id, in order.
    pub fn ids(&self) -> impl ExactSizeIterator<Item = WeightId> + '_ {
        (0..self.names.len() as u32).map(WeightId)
    }

    /// The entry of `id`.
    ///
    /// # Panics
    /// If `id` is not of this table.
    pub fn get(&self, id: WeightId) -> &WeightName {
        &self.names[id.index()]
    }

    /// The key of `id` (the tensor name, or `TENSOR#EXPERT`).
    ///
    /// # Panics
    /// If `id` is not of this table.
    pub fn key(&self, id: WeightId) -> &str {
        &self.get(id).key
    }

    /// The id of the weight whose key is `key`.
    pub fn id(&self, key: &str) -> Option<WeightId> {
        self.by_key.get(key).copied()
    }

    /// The weight with `role` in block `layer` (`None` for the output projection and the
    /// embedding), and `expert` for expert slices.
    pub fn find(&self, role: Role, layer: Option<u32>, expert: Option<u32>) -> Option<WeightId> {
        self.by_role
            .get(&(role, layer.unwrap_or(u32::MAX), expert))
            .copied()
    }
}
