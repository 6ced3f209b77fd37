//! Actors (DESIGN.md section 3). (to be written)
