//! ork-device (to be written).
