#if canImport(AVFoundation) && canImport(CoreGraphics)
import AVFoundation
import CoreGraphics
import Foundation

/// Frames out: RGB byte frames as CGImages, or as an H.264 .mp4 (upscaled, nearest
/// neighbour, so the 32x32 frames of tiny-sora stay crisp).
public enum VideoWriter {
    public static func image(_ rgb: [UInt8], width: Int, height: Int, scale: Int = 1) -> CGImage? {
        let w = width * scale, h = height * scale
        var rgba = [UInt8](repeating: 255, count: w * h * 4)
        for y in 0..<h { for x in 0..<w {
            let src = ((y / scale) * width + x / scale) * 3, dst = (y * w + x) * 4
            rgba[dst] = rgb[src]; rgba[dst + 1] = rgb[src + 1]; rgba[dst + 2] = rgb[src + 2]
        } }
        guard let provider = CGDataProvider(data: Data(rgba) as CFData) else { return nil }
        return CGImage(width: w, height: h, bitsPerComponent: 8, bitsPerPixel: 32,
                       bytesPerRow: w * 4,
                       space: CGColorSpaceCreateDeviceRGB(),
                       bitmapInfo: CGBitmapInfo(rawValue: CGImageAlphaInfo.noneSkipLast.rawValue),
                       provider: provider, decode: nil, shouldInterpolate: false,
                       intent: .defaultIntent)
    }

    /// Write `frames` to `url` (.mp4) at `fps`, each pixel repeated `scale` times.
    public static func writeMP4(_ frames: [[UInt8]], width: Int, height: Int, to url: URL,
                                fps: Int32 = 8, scale: Int = 8) async throws {
        try? FileManager.default.removeItem(at: url)
        let w = width * scale, h = height * scale
        let writer = try AVAssetWriter(outputURL: url, fileType: .mp4)
        let input = AVAssetWriterInput(mediaType: .video, outputSettings: [
            AVVideoCodecKey: AVVideoCodecType.h264, AVVideoWidthKey: w, AVVideoHeightKey: h])
        let adaptor = AVAssetWriterInputPixelBufferAdaptor(assetWriterInput: input,
                                                           sourcePixelBufferAttributes: [
            kCVPixelBufferPixelFormatTypeKey as String: kCVPixelFormatType_32BGRA,
            kCVPixelBufferWidthKey as String: w, kCVPixelBufferHeightKey as String: h])
        writer.add(input)
        guard writer.startWriting() else { throw writer.error ?? CocoaError(.fileWriteUnknown) }
        writer.startSession(atSourceTime: .zero)
        for (i, rgb) in frames.enumerated() {
            while !input.isReadyForMoreMediaData { try await Task.sleep(nanoseconds: 1_000_000) }
            var buffer: CVPixelBuffer?
            CVPixelBufferCreate(nil, w, h, kCVPixelFormatType_32BGRA, nil, &buffer)
            guard let buffer else { throw CocoaError(.fileWriteUnknown) }
            CVPixelBufferLockBaseAddress(buffer, [])
            let row = CVPixelBufferGetBytesPerRow(buffer)
            let base = CVPixelBufferGetBaseAddress(buffer)!.assumingMemoryBound(to: UInt8.self)
            for y in 0..<h { for x in 0..<w {
                let src = ((y / scale) * width + x / scale) * 3, dst = y * row + x * 4
                base[dst] = rgb[src + 2]; base[dst + 1] = rgb[src + 1]
                base[dst + 2] = rgb[src]; base[dst + 3] = 255
            } }
            CVPixelBufferUnlockBaseAddress(buffer, [])
            adaptor.append(buffer,
                           withPresentationTime: CMTime(value: CMTimeValue(i), timescale: fps))
        }
        input.markAsFinished()
        await writer.finishWriting()
        if writer.status != .completed { throw writer.error ?? CocoaError(.fileWriteUnknown) }
    }
}
#endif
