//! Pure bin-packing (to be written).
