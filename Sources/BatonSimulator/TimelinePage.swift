/// Renders a ``Timeline`` as one self-contained HTML page (inline SVG and CSS, no scripts or
/// external resources): a lane per process showing when it was alive, held the core role, was
/// connected, suspended or stalled, its kills, and each message's path from the server through
/// the process that stored it to the one that showed it.
public enum TimelinePage {
    /// - Parameters:
    ///   - timeline: The run's events.
    ///   - title: The page's heading.
    ///   - summary: Figures shown above the chart, in order.
    /// - Returns: The HTML document.
    public static func render(_ timeline: Timeline, title: String, summary: [(String, String)]) -> String {
        let events = timeline.events
        let origin = timeline.origin
        let end = max(events.last?.time ?? origin, origin + 1_000_000)
        let duration = Double(end - origin) / 1e9
        var lanes: [String] = ["server"]
        for event in events where event.process != "simulator" && event.process != "server" && !lanes.contains(event.process) {
            lanes.append(event.process)
        }
        let left = 110.0, width = 1180.0, laneHeight = 46.0, top = 30.0
        let height = top + Double(lanes.count) * laneHeight + 20
        func x(_ time: UInt64) -> Double { left + (Double(time >= origin ? time - origin : 0) / 1e9) / duration * width }
        func y(_ lane: String) -> Double { top + Double(lanes.firstIndex(of: lane) ?? 0) * laneHeight }
        func f(_ value: Double) -> String { "\((value * 10).rounded() / 10)" }

        var svg = ""
        // Time axis.
        let step = duration > 40 ? 5.0 : (duration > 15 ? 2.0 : 1.0)
        var tick = 0.0
        while tick <= duration {
            let tx = left + tick / duration * width
            svg += "<line x1='\(f(tx))' y1='\(f(top - 6))' x2='\(f(tx))' y2='\(f(height - 20))' class='grid'/>"
            svg += "<text x='\(f(tx))' y='\(f(top - 10))' class='tick'>\(Int(tick))s</text>"
            tick += step
        }
        // Lanes and their intervals.
        struct Band { var start: SimulatorEvent.Kind; var ends: Set<SimulatorEvent.Kind>; var css: String; var dy: Double; var h: Double; var label: String }
        let bands = [
            Band(start: .launched, ends: [.exited, .killed], css: "alive", dy: 2, h: laneHeight - 8, label: "alive"),
            Band(start: .foreground, ends: [.background, .willSuspend, .exited, .killed], css: "fg", dy: 2, h: laneHeight - 8, label: "app in the foreground"),
            Band(start: .roleAcquired, ends: [.roleReleased, .exited, .killed], css: "role", dy: 6, h: 11, label: "core role held"),
            Band(start: .connected, ends: [.disconnected, .exited, .killed], css: "conn", dy: 19, h: 8, label: "connected"),
            Band(start: .suspended, ends: [.resumed, .exited, .killed], css: "susp", dy: 29, h: 8, label: "suspended"),
            Band(start: .stalled, ends: [.continued, .exited, .killed], css: "stall", dy: 29, h: 8, label: "stalled (chaos)"),
        ]
        for (index, lane) in lanes.enumerated() {
            let ly = y(lane)
            if index % 2 == 1 { svg += "<rect x='0' y='\(f(ly))' width='\(f(left + width + 20))' height='\(f(laneHeight))' class='stripe'/>" }
            svg += "<text x='8' y='\(f(ly + laneHeight / 2 + 4))' class='lane'>\(escape(lane))</text>"
            let mine = events.filter { $0.process == lane }
            for band in bands {
                var open: UInt64?
                for event in mine {
                    if event.kind == band.start && open == nil { open = event.time }
                    else if band.ends.contains(event.kind), let started = open {
                        svg += "<rect x='\(f(x(started)))' y='\(f(ly + band.dy))' width='\(f(max(3, x(event.time) - x(started))))' height='\(f(band.h))' class='\(band.css)'><title>\(band.label)</title></rect>"
                        open = nil
                    }
                }
                if let started = open {
                    svg += "<rect x='\(f(x(started)))' y='\(f(ly + band.dy))' width='\(f(max(3, x(end) - x(started))))' height='\(f(band.h))' class='\(band.css)'><title>\(band.label)</title></rect>"
                }
            }
            for event in mine {
                let ex = x(event.time)
                switch event.kind {
                case .killed:
                    svg += "<text x='\(f(ex))' y='\(f(ly + 30))' class='kill'>✕<title>\(escape(event.detail ?? "killed"))</title></text>"
                case .dead10cc:
                    svg += "<text x='\(f(ex))' y='\(f(ly + 30))' class='dead'>☠<title>\(escape(event.detail ?? "0xDEAD10CC"))</title></text>"
                case .limit, .fault:
                    svg += "<text x='\(f(ex))' y='\(f(ly + 42))' class='fault'>⚡<title>\(escape(event.detail ?? "fault"))</title></text>"
                case .push:
                    if lane != "server" { svg += "<circle cx='\(f(ex))' cy='\(f(ly + 40))' r='2.5' class='push'><title>push \(escape(event.message ?? ""))</title></circle>" }
                default:
                    break
                }
            }
        }
        // Message paths: server (sent) -> storer (stored) -> shower (shown).
        var sent: [String: UInt64] = [:]
        var stored: [String: SimulatorEvent] = [:]
        var shown: [String: SimulatorEvent] = [:]
        for event in events {
            guard let id = event.message else { continue }
            if event.kind == .sent { sent[id] = event.time }
            if event.kind == .stored && stored[id] == nil { stored[id] = event }
            if event.kind == .shown && shown[id] == nil { shown[id] = event }
        }
        // Grouped by route (who stored it, who showed it): one color and one toggle per route,
        // so that 60 messages and more stay readable; each path is drawn faint, and at full
        // strength under the pointer, with its own tooltip.
        func route(_ id: String) -> String {
            guard let shower = shown[id]?.process else { return "never shown" }
            let storer = stored[id]?.process
            return storer == nil || storer == shower ? "shown by \(shower)" : "stored by \(storer!), shown by \(shower)"
        }
        let ids = sent.keys.sorted()
        var routes: [String] = []
        for id in ids where !routes.contains(route(id)) { routes.append(route(id)) }
        routes.sort { ($0 == "never shown" ? 1 : 0, $0) < ($1 == "never shown" ? 1 : 0, $1) }
        let palette = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f", "#393b79", "#637939", "#843c39"]
        func color(_ route: String) -> String { route == "never shown" ? "#d0021b" : palette[(routes.firstIndex(of: route) ?? 0) % palette.count] }
        var groups: [String: String] = [:]
        for id in ids {
            guard let sentAt = sent[id] else { continue }
            var points = [(x(sentAt), y("server") + laneHeight / 2)]
            if let s = stored[id] { points.append((x(s.time), y(s.process) + 23)) }
            if let s = shown[id] { points.append((x(s.time), y(s.process) + 23)) }
            let path = points.map { "\(f($0.0)),\(f($0.1))" }.joined(separator: " ")
            let lostClass = shown[id] == nil ? " lost" : ""
            let latency = shown[id].map { " (\(f(Double($0.time >= sentAt ? $0.time - sentAt : 0) / 1e6)) ms)" } ?? ""
            let note = "\(id): sent \(f(timeline.seconds(sentAt)))s" + (stored[id].map { ", stored by \($0.process) at \(f(timeline.seconds($0.time)))s" } ?? "") + (shown[id].map { ", shown by \($0.process) at \(f(timeline.seconds($0.time)))s" } ?? ", never shown") + latency
            var mark = "<g class='msg\(lostClass)'><title>\(escape(note))</title><polyline points='\(path)'/>"
            if let last = points.last { mark += "<circle cx='\(f(last.0))' cy='\(f(last.1))' r='2.2'/>" }
            groups[route(id), default: ""] += mark + "</g>"
        }
        for (index, name) in routes.enumerated() {
            svg += "<g class='route route\(index)' style='stroke:\(color(name));fill:\(color(name))'>\(groups[name] ?? "")</g>"
        }
        let counts = Dictionary(grouping: ids, by: route).mapValues(\.count)
        let toggles = routes.indices.map { "<input type='checkbox' id='route\($0)' checked>" }.joined()
        let routeLabels = routes.enumerated().map { index, name in
            "<label for='route\(index)' title='show or hide these message paths'><i style='background:\(color(name))'></i>\(escape(name)) (\(counts[name] ?? 0))</label>"
        }.joined()
        let routeCSS = routes.indices.map {
            "#route\($0):not(:checked) ~ svg .route\($0) { display: none; } #route\($0):not(:checked) ~ .routes label[for=route\($0)] { opacity: .35; text-decoration: line-through; }"
        }.joined(separator: "\n")
        let rows = summary.map { "<tr><th>\(escape($0.0))</th><td>\(escape($0.1))</td></tr>" }.joined()
        return """
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8"><title>\(escape(title))</title>
        <style>
        body { font: 13px/1.4 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 16px; color: #222; background: #fff; }
        h1 { font-size: 18px; margin: 0 0 8px; }
        table { border-collapse: collapse; margin-bottom: 8px; }
        th, td { padding: 1px 12px 1px 0; text-align: left; white-space: nowrap; } th { font-weight: 600; color: #555; }
        .summary table { display: grid; grid-template-columns: repeat(3, auto auto); width: max-content; gap: 0 8px; }
        .summary tbody, .summary tr { display: contents; }
        .legend { line-height: 1.7; margin: 4px 0; display: flex; flex-wrap: wrap; gap: 2px 14px; max-width: 1300px; }
        .legend i, .routes i { display: inline-block; width: 18px; height: 10px; margin-right: 4px; vertical-align: -1px; }
        .routes { display: flex; flex-wrap: wrap; gap: 2px 14px; max-width: 1300px; margin: 2px 0 6px; }
        .routes label { cursor: pointer; user-select: none; } .routes b { font-weight: 600; color: #555; }
        input[type=checkbox] { display: none; }
        svg { border: 1px solid #ddd; background: #fff; }
        .grid { stroke: #eee; } .tick { font-size: 10px; fill: #888; text-anchor: middle; }
        .lane { font-size: 12px; font-weight: 600; fill: #333; } .stripe { fill: #f7f7f9; }
        .alive { fill: #e6e9ef; } .fg { fill: #fbeec1; } .role { fill: #f0a030; } .conn { fill: #2e9e5b; }
        .susp { fill: #4a78d0; } .stall { fill: #9b59b6; }
        .kill { fill: #d0021b; font-size: 15px; font-weight: 700; text-anchor: middle; }
        .dead { fill: #000; font-size: 16px; text-anchor: middle; } .fault { fill: #d08000; font-size: 12px; text-anchor: middle; }
        .push { fill: #555; }
        .msg polyline { fill: none; stroke-width: 1; } .msg { opacity: 0.35; } .msg:hover { opacity: 1; } .msg:hover polyline { stroke-width: 3; }
        .msg.lost { opacity: 1; } .msg.lost polyline { stroke-dasharray: 4 3; stroke-width: 2; }
        \(routeCSS)
        </style></head><body>
        <h1>\(escape(title))</h1>
        <div class="summary"><table>\(rows)</table></div>
        <div class="legend"><span><i style="background:#e6e9ef"></i>process alive</span><span><i style="background:#fbeec1"></i>app in the foreground</span><span><i style="background:#f0a030"></i>core role held</span><span><i style="background:#2e9e5b"></i>connected to the server</span><span><i style="background:#4a78d0"></i>suspended</span><span><i style="background:#9b59b6"></i>stalled (chaos SIGSTOP)</span><br><span style="color:#d0021b">✕ killed</span><span>☠ 0xDEAD10CC kill</span><span style="color:#d08000">⚡ fault or limit</span><span>● push</span></div>
        \(toggles)
        <div class="routes"><span><b>message paths</b> (server → storer → shower; hover a line for its message, click a route to hide it):</span>\(routeLabels)</div>
        <svg xmlns="http://www.w3.org/2000/svg" width="\(f(left + width + 20))" height="\(f(height))" viewBox="0 0 \(f(left + width + 20)) \(f(height))">\(svg)</svg>
        </body></html>
        """
    }

    static func escape(_ text: String) -> String {
        var result = ""
        for character in text {
            switch character {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "'": result += "&#39;"
            case "\"": result += "&quot;"
            default: result.append(character)
            }
        }
        return result
    }
}
