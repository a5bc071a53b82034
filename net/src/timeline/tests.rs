//! Tests of the timeline: the spans and the file they make.

use super::*;

fn ev(ph: Ph, ts: u64, cat: &'static str, name: &'static str, id: u64) -> (u64, Event) {
    let args = Args {
        tensor: Some(Name::new("a \"b\"\n")),
        round: Some(3),
        ..Args::default()
    };
    (1, Event::new(ph, ts, cat, name.into(), id, Some(&args)))
}

#[test]
fn names_are_escaped() {
    let events = [
        ev(Ph::Begin, 10, "chunk", "compress", 7),
        ev(Ph::End, 12, "chunk", "compress", 7),
        ev(Ph::Instant, 14, FRAME, "push arrived", 8),
    ];
    let text = render(&events, &["worker 0".into()], 42);
    assert!(text.contains("\"a \\\"b\\\"\\n\""), "{text}");
    assert!(text.contains("\"ph\":\"n\""), "{text}");
    assert!(text.starts_with("{\"displayTimeUnit\""));
    assert!(text.trim_end().ends_with("]}"));
}

#[test]
fn a_whole_span_is_written_as_its_begin_and_end_in_time_order() {
    let mut whole = ev(Ph::Begin, 10, "chunk", "wait", 5);
    (whole.1.whole, whole.1.dur) = (true, 20);
    let events = [whole, ev(Ph::Instant, 20, FRAME, "written", 8)];
    let text = render(&events, &["worker 0".into()], 42);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"ts\"") && !l.contains("\"ph\":\"M\""))
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("{\"ph\":\"b\",\"cat\":\"chunk\",\"name\":\"wait\""));
    assert!(lines[0].contains("\"ts\":10,") && lines[0].contains("\"round\":3"));
    assert!(lines[1].contains("\"ph\":\"n\"") && lines[1].contains("\"ts\":20,"));
    assert!(lines[2].starts_with("{\"ph\":\"e\",\"cat\":\"chunk\",\"name\":\"wait\""));
    assert!(lines[2].contains("\"ts\":30,") && !lines[2].contains("args"));
}

#[test]
fn a_name_is_the_same_on_every_thread() {
    let a = Name::new("tensor a");
    assert_eq!(a, Name::new("tensor a"));
    assert_ne!(a, Name::new("tensor b"));
    let there = std::thread::spawn(|| Name::new("tensor a")).join().unwrap();
    assert_eq!(a, there);
    assert_eq!(&*lock(&NAMES).texts[a.0 as usize], "tensor a");
}

#[test]
fn an_event_is_88_bytes() {
    assert_eq!(std::mem::size_of::<Event>(), 88);
}

#[test]
fn a_frame_is_one_record_written_as_its_begin_mark_and_end() {
    let args = Args {
        key: Some(9),
        round: Some(2),
        ..Args::default()
    };
    let frame = |written| {
        let mark = |w: u64| if w == 0 { 0 } else { w - 100 + 1 };
        let e = Event {
            dur: 30,
            mark: mark(written) as u32,
            whole: true,
            ..Event::new(Ph::Begin, 100, FRAME, "push".into(), 4, Some(&args))
        };
        render(&[(1, e)], &["worker 0".into()], 42)
    };
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains("\"ts\"") && !l.contains("\"ph\":\"M\""))
            .map(String::from)
            .collect()
    };
    let with = frame(110);
    let l = lines(&with);
    assert_eq!(l.len(), 3, "{with}");
    assert!(l[0].starts_with("{\"ph\":\"b\",\"cat\":\"frame\",\"name\":\"push\""));
    assert!(l[0].contains("\"ts\":100,") && l[0].contains("\"key\":9"));
    assert!(
        l[1].starts_with("{\"ph\":\"n\",\"cat\":\"frame\",\"name\":\"written\""),
        "{with}"
    );
    assert!(l[1].contains("\"id\":\"0x4\",\"ts\":110,") && !l[1].contains("args"));
    assert!(l[2].starts_with("{\"ph\":\"e\",\"cat\":\"frame\",\"name\":\"push\""));
    assert!(l[2].contains("\"ts\":130,"));
    // Never written: its begin and end only.
    assert_eq!(lines(&frame(0)).len(), 2);
}

#[test]
fn a_literal_is_the_name_of_its_text() {
    let text = String::from("compress");
    assert_eq!(Name::of_static("compress"), Name::new(&text));
    assert_eq!(Label::from("wait").name(), Name::new("wait"));
}

#[test]
fn ids_fit_javascript_numbers() {
    assert!(id(&[u64::MAX, 1, 2]) < 1 << 52);
    assert_ne!(id(&[1, 2]), id(&[2, 1]));
}
