//! The radix mapping structure.
