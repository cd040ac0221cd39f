//! The only unsafe in this crate: mapping the file and dropping pages.
