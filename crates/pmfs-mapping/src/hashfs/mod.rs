//! The hashfs mapping structure.
