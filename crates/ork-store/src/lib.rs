//! ork-store (to be written).
