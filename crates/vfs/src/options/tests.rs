use super::*;

#[test]
fn sizes_take_binary_suffixes_in_either_case() {
    assert_eq!(parse_size("0"), Ok(0));
    assert_eq!(parse_size("1024"), Ok(1024));
    assert_eq!(parse_size("0K"), Ok(0));
    assert_eq!(parse_size("1k"), Ok(1 << 10));
    assert_eq!(parse_size("2M"), Ok(2 << 20));
    assert_eq!(parse_size("3g"), Ok(3 << 30));
    assert_eq!(parse_size("1T"), Ok(1 << 40));
    assert_eq!(parse_size("5p"), Ok(5 << 50));
    assert_eq!(parse_size("15E"), Ok(15 << 60));
    assert_eq!(parse_size("007"), Ok(7));
    assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
}

#[test]
fn sizes_outside_the_grammar_are_refused() {
    assert_eq!(parse_size(""), Err(SizeError::Empty));
    for v in [
        "K", "-1", "+1", " 1", "1 ", "1 K", "1.5M", "0x10", "1,000", "½", "١",
    ] {
        assert_eq!(parse_size(v), Err(SizeError::NotASize), "{v:?}");
    }
    assert_eq!(parse_size("4Q"), Err(SizeError::BadSuffix('Q')));
    assert_eq!(parse_size("1KB"), Err(SizeError::BadSuffix('B')));
    assert_eq!(parse_size("1b"), Err(SizeError::BadSuffix('b')));
}

#[test]
fn sizes_of_2_to_the_64_or_more_are_refused() {
    assert_eq!(parse_size("16E"), Err(SizeError::TooLarge));
    assert_eq!(parse_size("16384P"), Err(SizeError::TooLarge));
    assert_eq!(parse_size("18446744073709551616"), Err(SizeError::TooLarge));
    assert_eq!(
        parse_size("99999999999999999999G"),
        Err(SizeError::TooLarge)
    );
    assert_eq!(parse_size("17179869184G"), Err(SizeError::TooLarge));
    assert_eq!(parse_size("17179869183G"), Ok(17179869183 << 30));
}

#[test]
fn formatted_sizes_read_back() {
    assert_eq!(format_size(0), "0");
    assert_eq!(format_size(1536), "1536");
    assert_eq!(format_size(65536), "64K");
    assert_eq!(format_size(3 << 20), "3M");
    assert_eq!(format_size(1 << 40), "1T");
    assert_eq!(format_size(1 << 63), "8E");
    for n in [
        0,
        1,
        1023,
        1024,
        65536,
        3 << 20,
        1536,
        1 << 30,
        7 << 50,
        u64::MAX,
    ] {
        assert_eq!(parse_size(&format_size(n)), Ok(n), "{n}");
    }
}

#[test]
fn ids_are_decimal_and_never_minus_one() {
    assert_eq!(parse_id("0"), Ok(0));
    assert_eq!(parse_id("1000"), Ok(1000));
    assert_eq!(parse_id("4294967294"), Ok(u32::MAX - 1));
    assert_eq!(parse_id("4294967295"), Err(IdError::NoChange));
    assert_eq!(parse_id("-1"), Err(IdError::NoChange));
    for v in [
        "",
        "4294967296",
        "99999999999999999999999",
        "-2",
        "+5",
        " 5",
        "1k",
        "0x10",
        "abc",
    ] {
        assert_eq!(parse_id(v), Err(IdError::NotAnId), "{v:?}");
    }
    assert!(IdError::NoChange.to_string().contains("no change"));
}

#[test]
fn modes_are_octal_permission_bits() {
    assert_eq!(parse_mode("0"), Ok(0));
    assert_eq!(parse_mode("022"), Ok(0o22));
    assert_eq!(parse_mode("755"), Ok(0o755));
    assert_eq!(parse_mode("1777"), Ok(0o1777));
    assert_eq!(parse_mode("7777"), Ok(0o7777));
    assert_eq!(parse_mode("00000755"), Ok(0o755));
    // Too large, also past what 32 bits hold.
    for v in ["10000", "17777", "77777777777777777777"] {
        assert_eq!(parse_mode(v), Err(ModeError::TooLarge), "{v:?}");
    }
    for v in [
        "", "8", "9", "0o755", "0x1ff", "+755", "-1", " 755", "755 ", "7a", "u+x", "٧",
    ] {
        assert_eq!(parse_mode(v), Err(ModeError::NotOctal), "{v:?}");
    }
}

#[test]
fn items_split_at_commas_and_the_first_equals_sign() {
    let got: Vec<_> = items("ro,,a=b=c,e=,x").collect();
    assert_eq!(
        got,
        [
            ("ro", None),
            ("a", Some("b=c")),
            ("e", Some("")),
            ("x", None)
        ]
    );
    assert_eq!(items("").count(), 0);
    assert_eq!(flag("ro", None), Ok(()));
    assert!(flag("ro", Some("")).is_err());
    assert_eq!(required("k", Some("v")), Ok("v"));
    for v in [None, Some("")] {
        assert_eq!(
            required("k", v).unwrap_err().to_string(),
            "bad value for mount option `k`: needs a value"
        );
    }
    assert_eq!(size_value("push", "2M"), Ok(2 << 20));
    assert!(size_value("push", "2Q")
        .unwrap_err()
        .to_string()
        .contains("`push`: `2Q`: unknown size suffix"));
}

#[test]
fn option_errors_name_the_option() {
    assert_eq!(
        OptionError::Unknown("size=1M".into()).to_string(),
        "unknown mount option `size=1M`"
    );
    assert_eq!(
        OptionError::unknown("size", Some("1M")),
        OptionError::Unknown("size=1M".into())
    );
    assert_eq!(
        OptionError::unknown("bogus", None).to_string(),
        "unknown mount option `bogus`"
    );
    assert_eq!(
        OptionError::bad("uid", "`x`: nope").to_string(),
        "bad value for mount option `uid`: `x`: nope"
    );
}
