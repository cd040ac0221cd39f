//! ork-residency (to be written).
