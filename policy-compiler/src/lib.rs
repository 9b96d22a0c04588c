//! ace-policy: Cedar policies compiled into exact bitmask tables. (being built; see the issue that owns it).
