//! ork-exec (to be written).
