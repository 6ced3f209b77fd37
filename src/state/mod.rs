//! Indexes fed by watches (to be written).
